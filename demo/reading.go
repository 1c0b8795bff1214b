package demo

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/report"
)

// Reading returns a plain-language paragraph read off the figures: first
// the work the host cannot change (prefill tokens, hit rates), then the
// verdict (Verdict's winner, by the same rule), then why, kind of traffic
// by kind, kv-aware's reasons first. Every claim is computed from this
// run's numbers; a claim the numbers do not support is not made.
func (r *Result) Reading() string {
	fs := r.Figures()
	if len(fs) == 0 {
		return "No policy was run."
	}
	var b strings.Builder
	b.WriteString(work(fs))
	b.WriteString(r.verdictClause(fs))
	b.WriteString(why(fs))
	b.WriteString(docsWhy(fs))
	b.WriteString(agentWhy(fs))
	b.WriteString(r.skew())
	b.WriteString(errorsClause(fs))
	b.WriteString(crossCheck(fs))
	b.WriteString(r.hostClause())
	return strings.TrimSpace(b.String())
}

// kvFirst returns fs with kv-aware first, the rest in run order.
func kvFirst(fs []Figures) []Figures {
	out := make([]Figures, 0, len(fs))
	for _, f := range fs {
		if f.Policy == "kv-aware" {
			out = append(out, f)
		}
	}
	for _, f := range fs {
		if f.Policy != "kv-aware" {
			out = append(out, f)
		}
	}
	return out
}

// work states the prefill work and hit rate of every policy: figures
// that depend only on where requests went, not on the host's speed.
func work(fs []Figures) string {
	var parts []string
	for _, f := range kvFirst(fs) {
		parts = append(parts, fmt.Sprintf("%s %d (hit %.0f%%)", f.Policy, f.Prefill, 100*f.HitRate))
	}
	return fmt.Sprintf("Prefill work, which depends only on where requests went and not on the host: %s tokens. ",
		strings.Join(parts, ", "))
}

// verdictClause names the winner on mean TTFT (Rank), as Verdict does,
// with every other policy's figure and ratio, and says so plainly when
// kv-aware did not win.
func (r *Result) verdictClause(fs []Figures) string {
	if len(fs) < 2 {
		return ""
	}
	winner, _ := find(fs, report.Winner(r.Run()).Winner)
	var others []string
	for _, f := range kvFirst(fs) {
		if f.Policy != winner.Policy {
			others = append(others, fmt.Sprintf("%s %s (%.1f×)", f.Policy, ms(f.TTFTMean), ratio(f.TTFTMean.Seconds(), winner.TTFTMean.Seconds())))
		}
	}
	s := fmt.Sprintf("%s had the lowest mean time to first token on the engines' clocks, %s, against %s. ",
		winner.Policy, ms(winner.TTFTMean), strings.Join(others, ", "))
	if winner.Policy != "kv-aware" {
		if _, ok := find(fs, "kv-aware"); ok {
			s += "In this run kv-aware did NOT have the lowest mean TTFT. "
		}
	}
	return s
}

// why explains the conversations' hit rates by how policies placed them.
func why(fs []Figures) string {
	var scattered, kept []string
	for _, f := range kvFirst(fs) {
		hit := f.HitRate
		if k, ok := f.kind("chat"); ok {
			hit = k.HitRate
		}
		switch {
		case f.Spread >= 1.5:
			scattered = append(scattered, fmt.Sprintf("%s (%.1f replicas, hit %.0f%%)", f.Policy, f.Spread, 100*hit))
		case f.Spread > 0 && f.Spread < 1.2:
			kept = append(kept, fmt.Sprintf("%s (hit %.0f%%)", f.Policy, 100*hit))
		}
	}
	var b strings.Builder
	if len(kept) > 0 {
		fmt.Fprintf(&b, "Conversations: %s kept each conversation on about one replica, where its earlier turns were cached",
			strings.Join(kept, ", "))
		if len(scattered) > 0 {
			b.WriteString("; ")
		} else {
			b.WriteString(". ")
		}
	}
	if len(scattered) > 0 {
		if b.Len() == 0 {
			b.WriteString("Conversations: ")
		}
		fmt.Fprintf(&b, "%s spread each conversation over several replicas, so a turn often landed on one "+
			"that had not seen its history and prefilled it again. ", strings.Join(scattered, ", "))
	}
	return b.String()
}

// docsWhy explains the document sessions: reuse across sessions, which
// placing by session misses.
func docsWhy(fs []Figures) string {
	kd, sd, ok := kinds2(fs, "docs")
	if !ok || kd.Prefill <= 0 {
		return ""
	}
	if kd.Prefill >= sd.Prefill {
		return fmt.Sprintf("Documents shared across sessions: kv-aware prefilled %d tokens for them, session-hash %d; "+
			"in this run kv-aware did not save work there. ", kd.Prefill, sd.Prefill)
	}
	return fmt.Sprintf("Documents shared across sessions: kv-aware sent a new session to a replica that already held "+
		"its document, so the document questions cost %d tokens of prefill (hit %.0f%%); session-hash places a session "+
		"by its name alone, so each document was prefilled again on every replica its sessions hashed to: "+
		"%d tokens (hit %.0f%%), %.1f× the work. ",
		kd.Prefill, 100*kd.HitRate, sd.Prefill, 100*sd.HitRate, ratio(float64(sd.Prefill), float64(kd.Prefill)))
}

// kinds2 returns kv-aware's and session-hash's figures for the named
// kind of traffic; ok is false unless both ran and have it.
func kinds2(fs []Figures, name string) (kv, sh Kind, ok bool) {
	kvf, ok1 := find(fs, "kv-aware")
	shf, ok2 := find(fs, "session-hash")
	kv, ok3 := kvf.kind(name)
	sh, ok4 := shf.kind(name)
	return kv, sh, ok1 && ok2 && ok3 && ok4
}

// agentWhy explains the hot agent session: pinned to one replica it
// queues, spread it does not.
func agentWhy(fs []Figures) string {
	ka, sa, ok := kinds2(fs, "agent")
	if !ok {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "The hot agent session (%d steps, each a new tool result after the same tool schemas): ", sa.Requests)
	if ka.Replicas > 1 {
		fmt.Fprintf(&b, "kv-aware spread its steps over %d replicas once their wait where the schemas were cached "+
			"cost more than prefilling the schemas again elsewhere (mean TTFT %s); ", ka.Replicas, ms(ka.TTFTMean))
	} else {
		fmt.Fprintf(&b, "kv-aware kept its steps on one replica (mean TTFT %s); ", ms(ka.TTFTMean))
	}
	if sa.Replicas == 1 && 1.2*ka.TTFTMean.Seconds() < sa.TTFTMean.Seconds() {
		fmt.Fprintf(&b, "session-hash pinned all of them to one replica, which cannot prefill them as fast as they come, "+
			"so they queued there (mean TTFT %s, %.1f× kv-aware's), and the conversations hashed to that replica "+
			"queued behind them. ", ms(sa.TTFTMean), ratio(sa.TTFTMean.Seconds(), ka.TTFTMean.Seconds()))
	} else {
		fmt.Fprintf(&b, "session-hash ran them on %d replica(s) (mean TTFT %s): in this run they did not overload "+
			"a replica enough to tell the two apart. ", sa.Replicas, ms(sa.TTFTMean))
	}
	return b.String()
}

// hostClause says how busy the host was, what that does and does not
// change, and how long requests took to reach their engines.
func (r *Result) hostClause() string {
	if r.Host.Samples == 0 {
		return ""
	}
	var lag time.Duration
	var worst string
	for _, p := range r.Policies {
		if p.LagP90 > lag {
			lag, worst = p.LagP90, p.Policy
		}
	}
	path := ""
	if lag > 0 {
		path = fmt.Sprintf(" Requests took up to %s of model time (p90, under %s) from the client to their engine: "+
			"the router's and the host's part, which these latencies leave out.", ms(lag), worst)
	}
	if !r.Host.Busy() {
		return fmt.Sprintf(" The host was quiet (timers late by %v at p99).", r.Host.P99.Round(10*time.Microsecond)) + path
	}
	s := fmt.Sprintf(" The host was busy (timers late by %v at p99, %v at most): that delays when requests reach "+
		"the engines and what the router sees of them, but the engines' clocks run the work they owe when they wake, "+
		"so the latencies above are the model's, not the host's.", r.Host.P99.Round(time.Millisecond), r.Host.Max.Round(time.Millisecond))
	s += path
	if lag > time.Second && r.Config.TimeScale < 1 {
		s += fmt.Sprintf(" The host was too busy to feed the engines at %g× real time: rerun with --time-scale %g to give it more wall time.",
			1/r.Config.TimeScale, min(2*r.Config.TimeScale, 1))
	}
	return s
}

// skew explains a kv-aware run that piled requests on few replicas, from
// its requests per replica and its decision reasons.
func (r *Result) skew() string {
	for _, p := range r.Policies {
		if p.Policy != "kv-aware" {
			continue
		}
		total, top, idle := 0, 0, 0
		for _, n := range p.Report.PerReplica {
			total += n
			top = max(top, n)
			if n == 0 {
				idle++
			}
		}
		if total == 0 || len(p.Report.PerReplica) < 2 || idle == 0 && 2*top < total {
			return ""
		}
		decided := 0
		for _, n := range p.Report.Reasons {
			decided += n
		}
		var b strings.Builder
		fmt.Fprintf(&b, "kv-aware put %.0f%% of its requests on one replica", 100*float64(top)/float64(total))
		if idle > 0 {
			fmt.Fprintf(&b, " and left %d of %d idle", idle, len(p.Report.PerReplica))
		}
		fmt.Fprintf(&b, ": it sends a request where its prefix (a shared system prompt or document, then the session's history) "+
			"is cached unless its queue and batch there are predicted to cost the fleet more than prefilling the prompt elsewhere, "+
			"which it found for %d of %d requests (reason \"replicate\"). ", p.Report.Reasons["replicate"], decided)
		return b.String()
	}
	return ""
}

// errorsClause reports failed requests.
func errorsClause(fs []Figures) string {
	var bad []string
	for _, f := range fs {
		if f.Errors > 0 {
			bad = append(bad, fmt.Sprintf("%s %d", f.Policy, f.Errors))
		}
	}
	if len(bad) == 0 {
		return "No request failed under any policy. "
	}
	return fmt.Sprintf("Failed requests: %s. ", strings.Join(bad, ", "))
}

// crossCheck compares the responses' usage with the engines' counters.
func crossCheck(fs []Figures) string {
	worst := 0.0
	for _, f := range fs {
		worst = max(worst, math.Abs(f.HitRate-f.EngineHitRate))
	}
	if worst < 0.005 {
		return "The engines' own prefix-cache counters agree with the hit rates reported in the responses."
	}
	return fmt.Sprintf("The engines' own prefix-cache counters differ from the responses' usage by up to %.1f points "+
		"(requests cut short or failed are counted by the engines but not in usage).", 100*worst)
}

func find(fs []Figures, policy string) (Figures, bool) {
	for _, f := range fs {
		if f.Policy == policy {
			return f, true
		}
	}
	return Figures{}, false
}

// ratio is a/b, or 0 when b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

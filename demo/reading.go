package demo

import (
	"fmt"
	"math"
	"strings"
)

// Reading returns a plain-language paragraph read off the figures: which
// policy was fastest and by how much, the hit rates and prefill work of
// kv-aware and round-robin, and why, from how many replicas each policy
// spread a conversation over. Every claim is computed from this run's
// numbers; a claim the numbers do not support is not made.
func (r *Result) Reading() string {
	fs := r.Figures()
	if len(fs) == 0 {
		return "No policy was run."
	}
	var b strings.Builder
	best, worst := fs[0], fs[0]
	for _, f := range fs[1:] {
		if f.TTFTp50 < best.TTFTp50 {
			best = f
		}
		if f.TTFTp50 > worst.TTFTp50 {
			worst = f
		}
	}
	if len(fs) > 1 && best.TTFTp50 > 0 {
		fmt.Fprintf(&b, "%s had the lowest median time to first token, %s, %.1f× faster than %s (%s). ",
			best.Policy, ms(best.TTFTp50), ratio(worst.TTFTp50.Seconds(), best.TTFTp50.Seconds()), worst.Policy, ms(worst.TTFTp50))
	}
	kv, hasKV := find(fs, "kv-aware")
	rr, hasRR := find(fs, "round-robin")
	if hasKV && hasRR {
		fmt.Fprintf(&b, "kv-aware served %.0f%% of prompt tokens from the engines' prefix caches against %.0f%% for round-robin, "+
			"so the fleet prefilled %d tokens instead of %d (%.1f× less work)",
			100*kv.HitRate, 100*rr.HitRate, kv.Prefill, rr.Prefill, ratio(float64(rr.Prefill), float64(kv.Prefill)))
		switch {
		case kv.HitRate > rr.HitRate && kv.TTFTp50 < rr.TTFTp50:
			fmt.Fprintf(&b, ", and its median TTFT was %s against %s. ", ms(kv.TTFTp50), ms(rr.TTFTp50))
		default:
			fmt.Fprintf(&b, "; in this run kv-aware did NOT beat round-robin on both hit rate and median TTFT (%s against %s). ",
				ms(kv.TTFTp50), ms(rr.TTFTp50))
		}
	}
	b.WriteString(why(fs))
	b.WriteString(r.skew())
	b.WriteString(errorsClause(fs))
	b.WriteString(crossCheck(fs))
	return strings.TrimSpace(b.String())
}

// why explains the hit rates by how policies placed conversations.
func why(fs []Figures) string {
	var scattered, kept []string
	for _, f := range fs {
		switch {
		case f.Spread >= 1.5:
			scattered = append(scattered, fmt.Sprintf("%s (%.1f)", f.Policy, f.Spread))
		case f.Spread > 0 && f.Spread < 1.2:
			kept = append(kept, fmt.Sprintf("%s (%.1f)", f.Policy, f.Spread))
		}
	}
	var b strings.Builder
	if len(scattered) > 0 {
		fmt.Fprintf(&b, "Why: %s spread each conversation over several replicas on average, so a turn often landed "+
			"on a replica that had not seen its history and had to prefill it again; ", strings.Join(scattered, ", "))
	}
	if len(kept) > 0 {
		if b.Len() == 0 {
			b.WriteString("Why: ")
		}
		fmt.Fprintf(&b, "%s kept each conversation on about one replica, where its earlier turns were already cached. ",
			strings.Join(kept, ", "))
	} else if b.Len() > 0 {
		b.WriteString("no policy kept conversations together. ")
	}
	kv, okKV := find(fs, "kv-aware")
	sh, okSH := find(fs, "session-hash")
	if okKV && okSH && math.Abs(kv.HitRate-sh.HitRate) < 0.03 {
		fmt.Fprintf(&b, "session-hash reached a similar hit rate (%.0f%%) because this workload's reuse is within "+
			"conversations, which pinning a session captures; its median TTFT was %s. ", 100*sh.HitRate, ms(sh.TTFTp50))
	}
	return b.String()
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
		fmt.Fprintf(&b, ": it sends a request where its prefix (the shared system prompt, then the conversation's history) "+
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

package report

import (
	"fmt"
	"strings"
)

// Headline returns the run's verdict in plain language, the first line of
// the HTML report: which policy had the lowest TTFT p99 (or the metric
// Run.Rank names) and by how much
// (against the runner-up and the slowest), which had the highest hit rate
// against the pooled oracle, and where kv-aware ranked when it did not
// win. Rankings are Standing's: a policy that rejected more requests ranks
// after one that rejected fewer. Every figure is read off the run; a run
// with one policy gets its key figures instead of a verdict.
func Headline(run *Run) string {
	r := run.normalized()
	return headline(&r)
}

// headline is Headline over a normalized run.
func headline(r *Run) string {
	var done []*Result
	for i := range r.Policies {
		if r.Policies[i].Completed > 0 {
			done = append(done, &r.Policies[i])
		}
	}
	switch len(done) {
	case 0:
		if len(r.Policies) == 0 {
			return "No policy was run."
		}
		return "No request completed under any policy."
	case 1:
		return single(done[0])
	}
	rank, hit := r.rankMetric(), Metrics()[3]
	parts := []string{latencyClause(r, rank), hitClause(r, hit)}
	if s := kvAwareClause(r, rank); s != "" {
		parts = append(parts, s)
	}
	if rejectsDiffer(done) {
		parts = append(parts, "Policies that rejected more requests rank after those that rejected fewer.")
	}
	return strings.Join(parts, " ")
}

// single describes a run of one policy: what completed, its latencies and
// its hit rate.
func single(p *Result) string {
	s := fmt.Sprintf("%s: %d of %d requests completed; TTFT p50 %s, p99 %s; hit rate %s",
		p.Policy, p.Completed, p.Requests, dur(p.TTFT.P50), dur(p.TTFT.P99), pct(p.HitRate))
	if !p.NoPrediction {
		s += fmt.Sprintf(" (predicted %s)", pct(p.PredictedHitRate))
	}
	return s + "."
}

// latencyClause names the winner on m (a latency), the runner-up and the
// slowest, with the ratios.
func latencyClause(r *Run, m Metric) string {
	st := stand(r, m)
	winner := st.Winner
	if len(st.Tied) > 0 {
		winner = fmt.Sprintf("%s (tied with %s)", winner, strings.Join(st.Tied, ", "))
	}
	s := fmt.Sprintf("%s won on %s: %s", winner, label(m), m.text(st.Best))
	if st.RunnerUp == "" {
		return s + ", every policy the same."
	}
	worst, last := "", 0
	for n, k := range st.Ranks {
		if k > last || k == last && n < worst {
			worst, last = n, k
		}
	}
	s += fmt.Sprintf("; the runner-up, %s, took %s as long (%s)", st.RunnerUp, times(st.Ratios[st.RunnerUp]), m.text(figure(r, m, st.RunnerUp)))
	if worst != st.RunnerUp {
		s += fmt.Sprintf(", the last, %s, %s (%s)", worst, times(st.Ratios[worst]), m.text(figure(r, m, worst)))
	}
	return s + "."
}

// hitClause names the policy with the best hit rate (m), against the
// pooled oracle when the run has it.
func hitClause(r *Run, m Metric) string {
	st := stand(r, m)
	s := fmt.Sprintf("Highest hit rate: %s, %s", st.Winner, pct(st.Best))
	if pooled := r.pooled(); pooled > 0 {
		s += fmt.Sprintf(" (pooled-cache oracle %s)", pct(pooled))
	}
	if st.RunnerUp != "" && st.Best > 0 {
		s += fmt.Sprintf("; runner-up %s, %s", st.RunnerUp, pct(figure(r, m, st.RunnerUp)))
	}
	return s + "."
}

// kvAwareClause says where kv-aware ranked on m when it ran and did not
// win.
func kvAwareClause(r *Run, m Metric) string {
	st := stand(r, m)
	rank, ok := st.Ranks["kv-aware"]
	if !ok || rank == 1 {
		return ""
	}
	return fmt.Sprintf("kv-aware ranked %d of %d on %s: %s, %s the best.",
		rank, len(st.Ranks), label(m), m.text(figure(r, m, "kv-aware")), times(st.Ratios["kv-aware"]))
}

// figure returns policy's figure on m in r.
func figure(r *Run, m Metric, policy string) float64 {
	for i := range r.Policies {
		if r.Policies[i].Policy == policy {
			return m.value(&r.Policies[i])
		}
	}
	return 0
}

// rejectsDiffer reports whether the policies rejected different numbers
// of requests.
func rejectsDiffer(ps []*Result) bool {
	for _, p := range ps[1:] {
		if p.Rejected != ps[0].Rejected {
			return true
		}
	}
	return false
}

// boardHeadline is the leaderboard's verdict: per ranked metric, the
// policy that won the most cells, and where the default policy stands.
func boardHeadline(s *Summary) string {
	if len(s.Cells) == 0 {
		return "No cell was run."
	}
	var parts []string
	for _, m := range s.Metrics {
		best, wins := "", -1
		for _, p := range s.Policies {
			if w := s.Wins[m.Name][p]; w > wins {
				best, wins = p, w
			}
		}
		if best == "" {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s: %s won %d of %d cells", label(m), best, wins, len(s.Cells)))
	}
	out := strings.Join(parts, "; ") + "."
	if s.hasDefault() {
		within, ran := 0, 0
		for i := range s.Cells {
			if ok, has := s.Cells[i].DefaultWithin["ttft_p99"]; has {
				ran++
				if ok {
					within++
				}
			}
		}
		out += fmt.Sprintf(" %s was within %.0f%% of the best TTFT p99 in %d of %d cells.", s.Default, 100*s.Tolerance, within, ran)
	}
	if s.Capacity != nil {
		out += " " + s.Capacity.clause(s.Default)
	}
	return out
}

// label is m's label for a sentence: "TTFT p99", "hit rate".
func label(m Metric) string {
	if m.Name == "hit_rate" {
		return "hit rate"
	}
	return strings.Replace(strings.Replace(m.Label, "ttft", "TTFT", 1), "e2e", "end-to-end", 1)
}

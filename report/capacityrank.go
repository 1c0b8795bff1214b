package report

import (
	"fmt"
	"math"
	"strings"
)

// capacityStandings ranks the policies of normalized c at each of its
// levels, in order: the highest capacity first. Best is a load; Ratios
// are each policy's capacity divided by it (below 1 is worse).
func capacityStandings(c *Capacity) []*Standing {
	var out []*Standing
	for k := range c.Levels {
		names := make([]string, len(c.Policies))
		vals := make([]float64, len(c.Policies))
		for i, p := range c.Policies {
			names[i] = p.Policy
			if k < len(p.At) {
				vals[i] = p.At[k].Load
			}
		}
		out = append(out, rank(names, vals, func(i, j int) bool { return vals[i] > vals[j] }))
	}
	return out
}

// within reports whether policy's ratio in st is within Tolerance of the
// best, and whether the policy was ranked at all.
func within(st *Standing, policy string) (ok, ran bool) {
	q, ran := st.Ratios[policy]
	return ran && math.Abs(q-1) <= Tolerance+1e-9, ran
}

// capacityHeadline is the verdict of normalized searches cs at their
// first level: per workload, the policy with the highest capacity, its
// load and rate, and the runner-up's ratio to it; then how often def is
// within Tolerance of the best.
func capacityHeadline(cs []Capacity, def string) string {
	if len(cs) == 0 || len(cs[0].Levels) == 0 {
		return "No capacity was searched."
	}
	level := cs[0].Levels[0]
	var parts []string
	in, ran := 0, 0
	for i := range cs {
		c := &cs[i]
		st := capacityStandings(c)[0]
		if st.Winner == "" {
			continue
		}
		winner := st.Winner
		if len(st.Tied) > 0 {
			winner += " (tied with " + strings.Join(st.Tied, ", ") + ")"
		}
		s := fmt.Sprintf("%s: %s, load %.3g (%.3g req/s)", c.workload(), winner, st.Best, st.Best*c.KneeRate)
		if st.RunnerUp != "" {
			s += fmt.Sprintf(", the runner-up %s %s", st.RunnerUp, times(st.Ratios[st.RunnerUp]))
		}
		if q, ok := st.Ratios[def]; ok && st.Ranks[def] > 1 && def != st.RunnerUp {
			s += fmt.Sprintf(", %s %s", def, times(q))
		}
		parts = append(parts, s)
		if ok, r := within(st, def); r {
			ran++
			if ok {
				in++
			}
		}
	}
	out := fmt.Sprintf("Highest capacity at the %s SLO point: %s.", pctLevel(level), strings.Join(parts, "; "))
	if ran > 0 {
		out += fmt.Sprintf(" %s was within %.0f%% of the best on %d of %d workloads.", def, 100*Tolerance, in, ran)
	}
	return out
}

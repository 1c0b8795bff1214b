package report

import (
	"fmt"
	"io"
	"slices"
)

// CapacitySummary is how the policies of a leaderboard compare on
// capacity at the SLO: one capacity search per workload (Board.Capacity),
// ranked at each level.
type CapacitySummary struct {
	// Levels are the attainments searched for, 0..1, highest first.
	Levels []float64 `json:"levels"`
	// Policies are every policy searched, in the order they first ran.
	Policies []string `json:"policies"`
	// Workloads are the standings on each workload searched, in the
	// board's order.
	Workloads []CapacityStandings `json:"workloads"`
	// Wins counts, per level (in Levels' order) and policy, the
	// workloads where the policy has the highest capacity, ties included.
	Wins []map[string]int `json:"wins"`
}

// CapacityStandings is how the policies compare on one workload's
// capacity.
type CapacityStandings struct {
	Workload string `json:"workload"`
	// Levels are the standings at each of CapacitySummary.Levels, in
	// order: Best is the highest capacity, a load (1 = the workload's
	// knee_rate); Ratios each policy's capacity divided by Best (below 1
	// is worse); Ranks 1 for the highest, equal capacities sharing a rank.
	Levels []*Standing `json:"levels"`
	// DefaultWithin says per level whether the default policy's capacity
	// is within Tolerance of the best; absent when it did not run.
	DefaultWithin []bool `json:"default_within_tolerance,omitempty"`
}

// AddCapacity adds capacity searches, one per workload, to b: b.Capacity
// holds them as the writers print them, and b.Summary.Capacity ranks the
// policies on each at every level and judges the default policy. The
// searches share their levels (the first search's).
func (b *Board) AddCapacity(cs []Capacity) {
	if len(cs) == 0 {
		return
	}
	s := &CapacitySummary{Levels: slices.Clone(cs[0].Levels)}
	for range s.Levels {
		s.Wins = append(s.Wins, map[string]int{})
	}
	b.Capacity = nil
	for i := range cs {
		c := cs[i].normalized()
		b.Capacity = append(b.Capacity, c)
		s.Workloads = append(s.Workloads, s.add(&c, b.Summary.Default))
	}
	s.Policies = capacityPolicies(b.Capacity)
	b.Summary.Capacity = s
}

// add ranks normalized c's policies at every level and counts their wins.
func (s *CapacitySummary) add(c *Capacity, def string) CapacityStandings {
	cs := CapacityStandings{Workload: c.workload(), Levels: capacityStandings(c)}
	for k, st := range cs.Levels {
		if k >= len(s.Wins) {
			break
		}
		for _, p := range c.Policies {
			s.Wins[k][p.Policy] += 0 // every policy has a count
		}
		if st.Winner != "" {
			for _, p := range append([]string{st.Winner}, st.Tied...) {
				s.Wins[k][p]++
			}
		}
		if ok, ran := within(st, def); ran {
			cs.DefaultWithin = append(cs.DefaultWithin, ok)
		}
	}
	if len(cs.DefaultWithin) != len(cs.Levels) {
		cs.DefaultWithin = nil
	}
	return cs
}

// hasDefault reports whether the default policy's capacity was searched
// on any workload.
func (s *CapacitySummary) hasDefault() bool {
	return slices.ContainsFunc(s.Workloads, func(w CapacityStandings) bool { return w.DefaultWithin != nil })
}

// levelLabel names level k in tables: "capacity 99%".
func (s *CapacitySummary) levelLabel(k int) string { return "capacity " + pctLevel(s.Levels[k]) }

// writeCapacities writes each workload's capacity table with the
// policies' ranks at every level.
func writeCapacities(w io.Writer, b *Board) error {
	for i := range b.Capacity {
		c := &b.Capacity[i]
		slo := c.SLO.orDefault()
		fmt.Fprintf(w, "== %s · capacity at the SLO (TTFT ≤ %s, ITL ≤ %s): highest load with the level's share meeting it\n",
			c.workload(), dur(Millis(slo.TTFT)), dur(Millis(slo.ITL)))
		fmt.Fprintf(w, "load 1 = %.3g req/s, tolerance %.0f%%; # = rank at the level\n", c.KneeRate, 100*c.Tolerance)
		head, rows := capacityRows(c, b.Summary.Capacity.Workloads[i].Levels)
		if err := writeAligned(w, append([][]string{head}, rows...)); err != nil {
			return err
		}
		if _, err := fmt.Fprintln(w); err != nil {
			return err
		}
	}
	return nil
}

// writeCapacitySummary writes, per level, each workload's best capacity
// with the runner-up and the default policy; the workloads each policy
// wins; and whether the default policy is within Tolerance of the best.
func writeCapacitySummary(w io.Writer, s *Summary) error {
	cs := s.Capacity
	def := cs.hasDefault()
	for k := range cs.Levels {
		fmt.Fprintf(w, "\n%s (load; higher is better)\n", cs.levelLabel(k))
		rows := [][]string{standingHead("workload", s.Default, def)}
		for _, ws := range cs.Workloads {
			st := ws.Levels[k]
			rows = append(rows, standingRow(ws.Workload, st, fmt.Sprintf("%.3g", st.Best), s.Default, def))
		}
		if err := writeAligned(w, rows, 1, 3); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "\nworkloads won on capacity, of %d (ties count for each policy tied)\n", len(cs.Workloads))
	head := []string{"policy"}
	for k := range cs.Levels {
		head = append(head, cs.levelLabel(k))
	}
	rows := [][]string{head}
	for _, p := range cs.Policies {
		row := []string{p}
		for k := range cs.Levels {
			row = append(row, fmt.Sprint(cs.Wins[k][p]))
		}
		rows = append(rows, row)
	}
	if err := writeAligned(w, rows); err != nil || !def {
		return err
	}
	fmt.Fprintf(w, "\n%s's capacity within %.0f%% of the best (its ratio to the best)\n", s.Default, 100*s.Tolerance)
	rows = [][]string{append([]string{"workload"}, head[1:]...)}
	for _, ws := range cs.Workloads {
		row := []string{ws.Workload}
		for k, st := range ws.Levels {
			row = append(row, withinText(ws.DefaultWithin != nil, ws.DefaultWithin != nil && ws.DefaultWithin[k], st.Ratios[s.Default]))
		}
		rows = append(rows, row)
	}
	return writeAligned(w, rows)
}

// clause is the board verdict's part on capacity, at the first level:
// the policy that leads on the most workloads, and on how
// many the default policy def is within Tolerance of the best.
func (s *CapacitySummary) clause(def string) string {
	if len(s.Levels) == 0 || len(s.Workloads) == 0 {
		return ""
	}
	best, wins := "", -1
	for _, p := range s.Policies {
		if w := s.Wins[0][p]; w > wins {
			best, wins = p, w
		}
	}
	out := fmt.Sprintf("Capacity at %s: %s led %d of %d workloads.", pctLevel(s.Levels[0]), best, wins, len(s.Workloads))
	if !s.hasDefault() {
		return out
	}
	in, ran := 0, 0
	for _, w := range s.Workloads {
		if w.DefaultWithin != nil {
			ran++
			if w.DefaultWithin[0] {
				in++
			}
		}
	}
	return out + fmt.Sprintf(" %s's capacity was within %.0f%% of the best on %d of %d.", def, 100*Tolerance, in, ran)
}

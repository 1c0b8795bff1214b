package report

import (
	"fmt"
	"io"
	"strings"
)

// WriteBoardTable writes b for a terminal, in about 120 columns. Per cell:
// a heading (workload, load, fleet, SLO, oracles), then one row per policy
// with its key figures, each of Metrics followed by the policy's rank on
// it (#). Then the summary: per metric, each cell's winner, runner-up and
// the default policy with their figures' ratios to the best; the cells each
// policy wins per metric; and, per cell, whether the default policy is
// within Tolerance of the best on each metric. With capacity searches
// (AddCapacity), each workload's capacity table with the policies' ranks
// follows the cells, and the summary ends with the capacity standings per
// level, the workloads each policy wins and whether the default policy's
// capacity is within Tolerance of the best.
func WriteBoardTable(w io.Writer, b *Board) error {
	for i := range b.Cells {
		if err := writeCell(w, &b.Cells[i], &b.Summary.Cells[i], b.Summary.Metrics); err != nil {
			return err
		}
	}
	if b.Summary.Capacity != nil {
		if err := writeCapacities(w, b); err != nil {
			return err
		}
	}
	return writeSummary(w, &b.Summary)
}

// writeCell writes one cell's heading and rows.
func writeCell(w io.Writer, r *Run, cs *CellSummary, metrics []Metric) error {
	fmt.Fprintf(w, "== %s · %s requests, %s replicas, %s\n", cellName(cs), r.param("requests"), r.param("replicas"), r.param("preset"))
	var notes []string
	if r.SLO != nil {
		notes = append(notes, sloLine(*r.SLO))
	}
	var oracles []string
	for _, o := range r.Oracles {
		oracles = append(oracles, o.Name+" "+pct(o.HitRate))
	}
	if len(oracles) > 0 {
		notes = append(notes, "oracles: "+strings.Join(oracles, ", "))
	}
	if len(notes) > 0 {
		fmt.Fprintln(w, strings.Join(notes, " · "))
	}
	head := []string{"policy", "ttft p50"}
	for _, m := range metrics {
		head = append(head, m.column, "#")
	}
	rows := [][]string{append(head, "%pooled", "goodput", "slo", "done", "rej", "err")}
	for i := range r.Policies {
		p := &r.Policies[i]
		row := []string{p.Policy, dur(p.TTFT.P50)}
		for _, m := range metrics {
			rank := "-"
			if k, ok := cs.Metrics[m.Name].Ranks[p.Policy]; ok {
				rank = fmt.Sprint(k)
			}
			row = append(row, m.text(m.value(p)), rank)
		}
		rows = append(rows, append(row, pooledCell(p.PooledPct, len(r.Oracles)), fmt.Sprintf("%.2f/s", p.Goodput),
			pct(p.SLOMet), fmt.Sprint(p.Completed), fmt.Sprint(p.Rejected), fmt.Sprint(p.Errors)))
	}
	if err := writeAligned(w, rows); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w)
	return err
}

// writeSummary writes the summary tables.
func writeSummary(w io.Writer, s *Summary) error {
	fmt.Fprintf(w, "== summary over %d cells: ratio = a policy's figure / the cell's best\n", len(s.Cells))
	def := s.hasDefault()
	for _, m := range s.Metrics {
		better := "lower"
		if m.Higher {
			better = "higher"
		}
		fmt.Fprintf(w, "\n%s (%s is better)\n", m.Label, better)
		rows := [][]string{standingHead("cell", s.Default, def)}
		for i := range s.Cells {
			cs := &s.Cells[i]
			st := cs.Metrics[m.Name]
			rows = append(rows, standingRow(cellName(cs), st, m.text(st.Best), s.Default, def))
		}
		if err := writeAligned(w, rows, 1, 3); err != nil {
			return err
		}
	}
	if err := writeWins(w, s); err != nil {
		return err
	}
	if def {
		if err := writeWithin(w, s); err != nil {
			return err
		}
	}
	if s.Capacity == nil {
		return nil
	}
	return writeCapacitySummary(w, s)
}

// standingHead heads a summary table of standings, one row per what
// (cell or workload), with the default policy's columns when def.
func standingHead(what, dflt string, def bool) []string {
	head := []string{what, "winner", "best", "runner-up", "ratio"}
	if def {
		head = append(head, dflt, "rank")
	}
	return head
}

// standingRow is name's row of a summary table: st's winner, its figure
// (best), the runner-up and its ratio, and with def the default policy's
// ratio and rank.
func standingRow(name string, st *Standing, best, dflt string, def bool) []string {
	winner, runner := st.Winner, "-"
	if len(st.Tied) > 0 {
		winner += fmt.Sprintf(" (+%d tied)", len(st.Tied))
	}
	ratio := "-"
	if st.RunnerUp != "" {
		runner, ratio = st.RunnerUp, times(st.Ratios[st.RunnerUp])
	}
	row := []string{name, winner, best, runner, ratio}
	if def {
		row = append(row, "-", "-")
		if q, ok := st.Ratios[dflt]; ok {
			row[len(row)-2], row[len(row)-1] = times(q), fmt.Sprint(st.Ranks[dflt])
		}
	}
	return row
}

// writeWins writes the cells each policy wins per metric, policies in the
// order they first ran.
func writeWins(w io.Writer, s *Summary) error {
	fmt.Fprintf(w, "\ncells won, of %d (ties count for each policy tied)\n", len(s.Cells))
	head := []string{"policy"}
	for _, m := range s.Metrics {
		head = append(head, m.Label)
	}
	rows := [][]string{head}
	for _, p := range s.Policies {
		row := []string{p}
		for _, m := range s.Metrics {
			row = append(row, fmt.Sprint(s.Wins[m.Name][p]))
		}
		rows = append(rows, row)
	}
	return writeAligned(w, rows)
}

// writeWithin writes, per cell, whether the default policy is within
// Tolerance of the best on each metric, and its ratio.
func writeWithin(w io.Writer, s *Summary) error {
	fmt.Fprintf(w, "\n%s within %.0f%% of the best (its ratio to the best)\n", s.Default, 100*s.Tolerance)
	head := []string{"cell"}
	for _, m := range s.Metrics {
		head = append(head, m.Label)
	}
	rows := [][]string{head}
	for i := range s.Cells {
		cs := &s.Cells[i]
		row := []string{cellName(cs)}
		for _, m := range s.Metrics {
			ok, ran := cs.DefaultWithin[m.Name]
			row = append(row, withinText(ran, ok, cs.Metrics[m.Name].Ratios[s.Default]))
		}
		rows = append(rows, row)
	}
	return writeAligned(w, rows)
}

// withinText says whether a policy that ran is within Tolerance of the
// best, with its ratio q: "yes (1.02×)"; "-" when it did not run.
func withinText(ran, ok bool, q float64) string {
	switch {
	case !ran:
		return "-"
	case ok:
		return "yes (" + times(q) + ")"
	}
	return "no (" + times(q) + ")"
}

// hasDefault reports whether the default policy ran in any cell.
func (s *Summary) hasDefault() bool {
	for i := range s.Cells {
		if s.Cells[i].DefaultWithin != nil {
			return true
		}
	}
	return false
}

// cellName names a cell in tables: "shared-prefix @ 0.8".
func cellName(cs *CellSummary) string { return fmt.Sprintf("%s @ %g", cs.Workload, cs.Load) }

// times formats a ratio: "1.04×".
func times(q float64) string { return fmt.Sprintf("%.2f×", q) }

// text formats a figure of m: a duration or a percentage.
func (m Metric) text(v float64) string {
	if m.fraction {
		return pct(v)
	}
	return dur(Millis(v * 1e6))
}

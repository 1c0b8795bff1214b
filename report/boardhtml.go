package report

import (
	"fmt"
	"io"
	"strings"
)

// boardPage is the leaderboard template's input.
type boardPage struct {
	common
	Title    string
	Headline string
	Params   []Param
	Tables   []boardTable
	Within   *boardTable // nil when the default policy ran nowhere
	Cells    []cellSection
	Data     []chartData // per cell
	// CapTables, CapSections and CapData are the capacity summary tables,
	// and per workload its section and attainment chart; empty when the
	// board has no capacity searches.
	CapTables   []boardTable
	CapSections []capacitySection
	CapData     []attainData
}

// boardTable is a summary table: one row per cell.
type boardTable struct {
	Title  string
	Header []string
	Rows   [][]boardCell
}

// boardCell is one table cell; Best marks a winning figure.
type boardCell struct {
	Text string
	Best bool
}

// cellSection is one cell's section: today's run table with the ranks.
type cellSection struct {
	Index  int
	Name   string
	Params []Param
	Header []string
	Rows   [][]string
	Policy int // rows before this index are policies, the rest oracles
	Hits   hitBars
}

// WriteBoardHTML writes b as one self-contained HTML page: the summary
// (per metric, every policy's ratio to each cell's best and the cells it
// wins; whether the default policy is within Tolerance), then one section
// per cell with its parameters, the run table with each policy's ranks,
// its TTFT CDF and its hit rates against the oracles. Its first line is
// the verdict: per metric, the policy that won the most cells.
func WriteBoardHTML(w io.Writer, b *Board) error {
	s := &b.Summary
	p := boardPage{common: newCommon(), Title: "kvrouter leaderboard", Headline: boardHeadline(s), Params: []Param{
		{"cells", fmt.Sprint(len(b.Cells))}, {"policies", fmt.Sprint(len(s.Policies))}, {"default", s.Default},
	}}
	for _, m := range s.Metrics {
		p.Tables = append(p.Tables, ratioTable(s, m))
	}
	if s.hasDefault() {
		t := withinTable(s)
		p.Within = &t
	}
	p.CapData = []attainData{}
	if cs := s.Capacity; cs != nil {
		p.CapTables = capacityTables(s)
		for i := range b.Capacity {
			p.CapSections = append(p.CapSections, newCapacitySection(i, &b.Capacity[i], cs.Workloads[i].Levels))
			p.CapData = append(p.CapData, newAttainData(&b.Capacity[i]))
		}
	}
	for i := range b.Cells {
		p.Cells = append(p.Cells, section(i, &b.Cells[i], &s.Cells[i], s.Metrics))
		d := charts(&b.Cells[i])
		d.Load = []loadChart{} // not drawn: keeps the page small
		p.Data = append(p.Data, d)
	}
	return render(w, "board.html", &p)
}

// ratioTable is metric m's table: per cell, the best figure and every
// policy's ratio to it, then the cells each policy wins.
func ratioTable(s *Summary, m Metric) boardTable {
	better := "lower"
	if m.Higher {
		better = "higher"
	}
	t := boardTable{Title: fmt.Sprintf("%s (%s is better)", m.Label, better), Header: append([]string{"cell", "best"}, s.Policies...)}
	for i := range s.Cells {
		st := s.Cells[i].Metrics[m.Name]
		t.Rows = append(t.Rows, ratioRow(cellName(&s.Cells[i]), m.text(st.Best), st, s.Policies))
	}
	t.Rows = append(t.Rows, winsRow("cells won", s.Wins[m.Name], s.Policies))
	return t
}

// ratioRow is name's row of a ratio table: the best figure, then every
// policy's ratio to it, the best in bold.
func ratioRow(name, best string, st *Standing, policies []string) []boardCell {
	row := []boardCell{{Text: name}, {Text: best}}
	for _, p := range policies {
		c := boardCell{Text: "-"}
		if q, ok := st.Ratios[p]; ok {
			c = boardCell{Text: times(q), Best: st.Ranks[p] == 1}
		}
		row = append(row, c)
	}
	return row
}

// winsRow is a ratio table's last row: what each policy won.
func winsRow(label string, wins map[string]int, policies []string) []boardCell {
	row := []boardCell{{Text: label}, {}}
	for _, p := range policies {
		row = append(row, boardCell{Text: fmt.Sprint(wins[p])})
	}
	return row
}

// withinCell says whether a policy that ran is within Tolerance of the
// best, with its ratio q, bold when it is.
func withinCell(ran, ok bool, q float64) boardCell {
	return boardCell{Text: strings.NewReplacer("(", "", ")", "").Replace(withinText(ran, ok, q)), Best: ran && ok}
}

// withinTable says per cell and metric whether the default policy is
// within Tolerance of the best, with its ratio.
func withinTable(s *Summary) boardTable {
	t := boardTable{Title: fmt.Sprintf("%s within %.0f%% of the best", s.Default, 100*s.Tolerance), Header: []string{"cell"}}
	for _, m := range s.Metrics {
		t.Header = append(t.Header, m.Label)
	}
	for i := range s.Cells {
		cs := &s.Cells[i]
		row := []boardCell{{Text: cellName(cs)}}
		for _, m := range s.Metrics {
			ok, ran := cs.DefaultWithin[m.Name]
			row = append(row, withinCell(ran, ok, cs.Metrics[m.Name].Ratios[s.Default]))
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}

// section is cell i's section: the run table (normalized r) with one rank
// column per metric.
func section(i int, r *Run, cs *CellSummary, metrics []Metric) cellSection {
	c := cellSection{Index: i, Name: cellName(cs), Params: r.Params, Header: tableHeader(), Rows: tableRows(r, ""),
		Policy: len(r.Policies), Hits: newHitBars(r)}
	for _, m := range metrics {
		c.Header = append(c.Header, "# "+m.Label)
	}
	for k := range c.Rows {
		for _, m := range metrics {
			rank := ""
			if k < len(r.Policies) {
				if n, ok := cs.Metrics[m.Name].Ranks[r.Policies[k].Policy]; ok {
					rank = fmt.Sprint(n)
				}
			}
			c.Rows[k] = append(c.Rows[k], rank)
		}
	}
	return c
}

// capacityTables are the capacity summary's tables: per level, each
// workload's best capacity and every policy's ratio to it, then the
// workloads each wins; and whether the default policy is within
// Tolerance of the best.
func capacityTables(s *Summary) []boardTable {
	cs := s.Capacity
	var out []boardTable
	for k := range cs.Levels {
		t := boardTable{Title: cs.levelLabel(k) + " (load; higher is better)", Header: append([]string{"workload", "best"}, cs.Policies...)}
		for _, ws := range cs.Workloads {
			t.Rows = append(t.Rows, ratioRow(ws.Workload, fmt.Sprintf("%.3g", ws.Levels[k].Best), ws.Levels[k], cs.Policies))
		}
		out = append(out, boardTable{Title: t.Title, Header: t.Header, Rows: append(t.Rows, winsRow("workloads won", cs.Wins[k], cs.Policies))})
	}
	if !cs.hasDefault() {
		return out
	}
	t := boardTable{Title: fmt.Sprintf("%s's capacity within %.0f%% of the best", s.Default, 100*s.Tolerance), Header: []string{"workload"}}
	for k := range cs.Levels {
		t.Header = append(t.Header, cs.levelLabel(k))
	}
	for _, ws := range cs.Workloads {
		row := []boardCell{{Text: ws.Workload}}
		for k, st := range ws.Levels {
			ran := ws.DefaultWithin != nil
			row = append(row, withinCell(ran, ran && ws.DefaultWithin[k], st.Ratios[s.Default]))
		}
		t.Rows = append(t.Rows, row)
	}
	return append(out, t)
}

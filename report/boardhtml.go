package report

import (
	"fmt"
	"io"
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
		row := []boardCell{{Text: cellName(&s.Cells[i])}, {Text: m.text(st.Best)}}
		for _, p := range s.Policies {
			c := boardCell{Text: "-"}
			if q, ok := st.Ratios[p]; ok {
				c = boardCell{Text: times(q), Best: st.Ranks[p] == 1}
			}
			row = append(row, c)
		}
		t.Rows = append(t.Rows, row)
	}
	wins := []boardCell{{Text: "cells won"}, {}}
	for _, p := range s.Policies {
		wins = append(wins, boardCell{Text: fmt.Sprint(s.Wins[m.Name][p])})
	}
	t.Rows = append(t.Rows, wins)
	return t
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
			c := boardCell{Text: "-"}
			if ok, ran := cs.DefaultWithin[m.Name]; ran {
				c = boardCell{Text: "no " + times(cs.Metrics[m.Name].Ratios[s.Default])}
				if ok {
					c = boardCell{Text: "yes " + times(cs.Metrics[m.Name].Ratios[s.Default]), Best: true}
				}
			}
			row = append(row, c)
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

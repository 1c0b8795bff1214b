package report

import (
	"fmt"
	"slices"
	"strings"
)

// ClassResult is one SLO class's attainment in a run.
type ClassResult struct {
	Class string `json:"class"`
	// SLO is the class's bounds (of its first request, when its requests
	// carry different ones).
	SLO SLO `json:"slo"`
	// Requests counts the class's requests; SLOMet is the share of them,
	// 0..1, that completed within the class's bounds.
	Requests int     `json:"requests"`
	SLOMet   float64 `json:"slo_met"`
	// Rejected counts the class's requests the router refused (its queue
	// full or timed out, or no replica predicted to meet their SLO);
	// SLOQueued those it held in its queue for their SLO.
	Rejected  int `json:"rejected,omitempty"`
	SLOQueued int `json:"slo_queued,omitempty"`
}

// classResults is the attainment of every SLO class of samples, by
// class name.
func classResults(samples []Sample) []ClassResult {
	at := map[string]int{}
	var out []ClassResult
	for i := range samples {
		s := &samples[i]
		if s.Class == "" {
			continue
		}
		k, ok := at[s.Class]
		if !ok {
			k = len(out)
			at[s.Class] = k
			out = append(out, ClassResult{Class: s.Class, SLO: s.SLO})
		}
		out[k].Requests++
		if s.Rejected {
			out[k].Rejected++
		}
		if s.SLOQueued {
			out[k].SLOQueued++
		}
		if s.meets(SLO{}) {
			out[k].SLOMet++
		}
	}
	for k := range out {
		out[k].SLOMet /= float64(out[k].Requests)
	}
	slices.SortFunc(out, func(a, b ClassResult) int { return strings.Compare(a.Class, b.Class) })
	return out
}

// classRows are the per-class table of normalized r: a header naming each
// class and its bounds, and one row per policy with the share of each
// class's requests meeting them; nil when no policy's requests have a
// class.
func classRows(r *Run) [][]string {
	var classes []ClassResult
	for _, p := range r.Policies {
		for _, c := range p.Classes {
			if !slices.ContainsFunc(classes, func(x ClassResult) bool { return x.Class == c.Class }) {
				classes = append(classes, c)
			}
		}
	}
	if len(classes) == 0 {
		return nil
	}
	head := []string{"SLO met by class"}
	for _, c := range classes {
		head = append(head, fmt.Sprintf("%s (TTFT ≤ %s, ITL ≤ %s)", c.Class, dur(Millis(c.SLO.TTFT)), dur(Millis(c.SLO.ITL))))
	}
	rows := [][]string{head}
	for _, p := range r.Policies {
		row := []string{p.Policy}
		for _, c := range classes {
			cell := "-"
			if k := slices.IndexFunc(p.Classes, func(x ClassResult) bool { return x.Class == c.Class }); k >= 0 {
				cell = classCell(&p.Classes[k])
			}
			row = append(row, cell)
		}
		rows = append(rows, row)
	}
	return rows
}

// classCell is a class's cell of classRows: the share meeting its SLO,
// and how many the router rejected or queued for their SLO, if any.
func classCell(c *ClassResult) string {
	cell := fmt.Sprintf("%.1f%%", 100*c.SLOMet)
	if c.Rejected > 0 || c.SLOQueued > 0 {
		cell += fmt.Sprintf(" (%d rejected, %d queued)", c.Rejected, c.SLOQueued)
	}
	return cell
}

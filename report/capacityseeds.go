package report

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// Spread is a figure over several runs: its median (of an even count, the
// mean of the middle two) and its range.
type Spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	// Each is the figure of every run, in the runs' order.
	Each []float64 `json:"each"`
}

// NewSpread is the spread of xs; zero without any.
func NewSpread(xs []float64) Spread {
	if len(xs) == 0 {
		return Spread{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return Spread{Median: med, Min: s[0], Max: s[n-1], Each: slices.Clone(xs)}
}

// CapacitySeeds is one capacity search run once per seed (the workload
// generated and the ties broken with each): per policy and level, the
// spread of its capacity over the seeds, and of one policy's capacity
// divided by the best other policy's.
type CapacitySeeds struct {
	Workload string    `json:"workload"`
	SLO      SLO       `json:"slo"`
	Seeds    []uint64  `json:"seeds"`
	Levels   []float64 `json:"levels"`
	// Policies are each policy's capacity (a load) at each level, in
	// Levels' order.
	Policies []PolicySpread `json:"policies"`
	// Policy is the policy whose Ratio is given: at each level, its
	// capacity ÷ the highest of the other policies', per seed (a seed
	// where every other policy's is zero is left out).
	Policy string   `json:"policy"`
	Ratio  []Spread `json:"ratio"`
	// Runs are the searches, one per seed, in Seeds' order.
	Runs []Capacity `json:"runs"`
}

// PolicySpread is one policy's capacity over seeds, per level.
type PolicySpread struct {
	Policy string   `json:"policy"`
	At     []Spread `json:"at"`
}

// NewCapacitySeeds summarizes runs, the same search with seeds[i] each
// (the same policies and levels), with policy's ratio to the best other.
func NewCapacitySeeds(runs []Capacity, seeds []uint64, policy string) CapacitySeeds {
	out := CapacitySeeds{Seeds: seeds, Policy: policy, Runs: runs}
	if len(runs) == 0 {
		return out
	}
	first := &runs[0]
	out.Workload, out.SLO, out.Levels = first.workload(), first.SLO, first.Levels
	loadAt := func(c *Capacity, p, k int) float64 {
		if p < len(c.Policies) && k < len(c.Policies[p].At) {
			return c.Policies[p].At[k].Load
		}
		return 0
	}
	self := -1
	for p, pc := range first.Policies {
		ps := PolicySpread{Policy: pc.Policy}
		for k := range first.Levels {
			var xs []float64
			for i := range runs {
				xs = append(xs, loadAt(&runs[i], p, k))
			}
			ps.At = append(ps.At, NewSpread(xs))
		}
		out.Policies = append(out.Policies, ps)
		if pc.Policy == policy {
			self = p
		}
	}
	if self < 0 || len(first.Policies) < 2 {
		out.Policy, out.Ratio = "", nil
		return out
	}
	for k := range first.Levels {
		var qs []float64
		for i := range runs {
			best := 0.0
			for p := range first.Policies {
				if p != self {
					best = max(best, loadAt(&runs[i], p, k))
				}
			}
			if best > 0 {
				qs = append(qs, loadAt(&runs[i], self, k)/best)
			}
		}
		out.Ratio = append(out.Ratio, NewSpread(qs))
	}
	return out
}

// spreadText writes s as "median [min–max]".
func spreadText(s Spread) string {
	if len(s.Each) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3g [%.3g–%.3g]", s.Median, s.Min, s.Max)
}

// WriteCapacitySeedsTable writes cs as a table: per policy its capacity
// at each level as median [min–max] over the seeds, then the ratio row.
func WriteCapacitySeedsTable(w io.Writer, cs *CapacitySeeds) error {
	slo := cs.SLO.orDefault()
	seeds := make([]string, len(cs.Seeds))
	for i, s := range cs.Seeds {
		seeds[i] = fmt.Sprint(s)
	}
	varies := ""
	for i := range cs.Runs {
		if cs.Runs[i].SLO != cs.SLO {
			varies = fmt.Sprintf(" for seed %s, derived from each seed's workload", seeds[0])
		}
	}
	fmt.Fprintf(w, "capacity at the SLO (TTFT ≤ %s, ITL ≤ %s%s) over seeds %s: median [min–max] of the highest load meeting each level\n",
		dur(Millis(slo.TTFT)), dur(Millis(slo.ITL)), varies, strings.Join(seeds, ", "))
	head := []string{"policy"}
	for _, l := range cs.Levels {
		head = append(head, "load@"+pctLevel(l))
	}
	rows := [][]string{head}
	for _, p := range cs.Policies {
		row := []string{p.Policy}
		for _, s := range p.At {
			row = append(row, spreadText(s))
		}
		rows = append(rows, row)
	}
	if cs.Policy != "" {
		row := []string{cs.Policy + " ÷ best other"}
		for _, s := range cs.Ratio {
			row = append(row, spreadText(s))
		}
		rows = append(rows, row)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, row := range rows {
		fmt.Fprintln(tw, strings.Join(append(row, ""), "\t"))
	}
	return tw.Flush()
}

// WriteCapacitySeedsJSON writes several summaries as one indented JSON
// array, figures rounded as the other writers round them.
func WriteCapacitySeedsJSON(w io.Writer, css []CapacitySeeds) error {
	out := make([]CapacitySeeds, len(css))
	for i, cs := range css {
		cs.Policies = slices.Clone(cs.Policies)
		for p := range cs.Policies {
			cs.Policies[p].At = roundSpreads(cs.Policies[p].At)
		}
		cs.Ratio = roundSpreads(cs.Ratio)
		runs := make([]Capacity, len(cs.Runs))
		for k := range cs.Runs {
			runs[k] = cs.Runs[k].normalized()
		}
		cs.Runs = runs
		out[i] = cs
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// roundSpreads is ss with its figures rounded to 6 digits.
func roundSpreads(ss []Spread) []Spread {
	out := make([]Spread, len(ss))
	for i, s := range ss {
		each := make([]float64, len(s.Each))
		for k, x := range s.Each {
			each[k] = round6(x)
		}
		out[i] = Spread{Median: round6(s.Median), Min: round6(s.Min), Max: round6(s.Max), Each: each}
	}
	return out
}

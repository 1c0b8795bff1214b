package report

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
)

// Tolerance is how close to a cell's best figure counts as on par with it:
// within 3% of the best.
const Tolerance = 0.03

// Metric is a key figure the leaderboard ranks policies on.
type Metric struct {
	// Name is the figure's JSON key: "ttft_p99", "ttft_mean", "e2e_p99",
	// "hit_rate".
	Name string `json:"name"`
	// Label heads the figure's table column: "ttft p99".
	Label string `json:"-"`
	// Higher is true when higher is better (hit rate); latencies are better
	// lower.
	Higher bool `json:"higher_is_better"`
	// value reads the figure off a normalized Result as JSON writes it:
	// milliseconds to three decimals, or a fraction 0..1 when fraction is
	// set.
	value    func(*Result) float64
	fraction bool
	// column heads the figure's column in a cell's table, after "ttft
	// p50": "p99".
	column string
}

// Metrics returns the figures the leaderboard ranks on, in order: TTFT p99,
// TTFT mean and end-to-end p99 (lower is better) and the hit rate (higher
// is better).
func Metrics() []Metric {
	ms := func(f func(*Result) Millis) func(*Result) float64 {
		return func(r *Result) float64 { return math.Round(float64(f(r))/1e3) / 1e3 }
	}
	return []Metric{
		{Name: "ttft_p99", Label: "ttft p99", column: "p99", value: ms(func(r *Result) Millis { return r.TTFT.P99 })},
		{Name: "ttft_mean", Label: "ttft mean", column: "mean", value: ms(func(r *Result) Millis { return r.TTFT.Mean })},
		{Name: "e2e_p99", Label: "e2e p99", column: "e2e p99", value: ms(func(r *Result) Millis { return r.E2E.P99 })},
		{Name: "hit_rate", Label: "hit", column: "hit", Higher: true, fraction: true, value: func(r *Result) float64 { return r.HitRate }},
	}
}

// Standing is how the policies of one cell compare on one metric. A policy
// that completed no request has no figure and is left out.
type Standing struct {
	// Winner is the first policy, in run order, with the best figure;
	// Tied are the others with the same figure.
	Winner string   `json:"winner"`
	Tied   []string `json:"tied,omitempty"`
	// Best is the best figure: milliseconds, or a fraction for hit rate.
	Best float64 `json:"best"`
	// RunnerUp is the first policy with the best figure after Best; empty
	// when every policy ties.
	RunnerUp string `json:"runner_up,omitempty"`
	// Ranks are 1 for the best; equal figures share a rank (1, 1, 3).
	Ranks map[string]int `json:"ranks"`
	// Ratios are each figure divided by Best: 1 for the winners, above 1
	// worse for a latency, below 1 worse for hit rate.
	Ratios map[string]float64 `json:"ratios"`
}

// CellSummary is the standings of one (workload, load) cell.
type CellSummary struct {
	Workload string  `json:"workload"`
	Load     float64 `json:"load"`
	// Metrics are the standings, keyed by Metric.Name.
	Metrics map[string]*Standing `json:"metrics"`
	// DefaultWithin says, per metric, whether the default policy's figure
	// is within Tolerance of the best; absent when it did not run.
	DefaultWithin map[string]bool `json:"default_within_tolerance,omitempty"`
}

// Summary is who wins where, and by how much.
type Summary struct {
	// Default is the policy judged on every cell (kvrouter's default).
	Default   string   `json:"default"`
	Tolerance float64  `json:"tolerance"`
	Metrics   []Metric `json:"metrics"`
	// Policies are every policy of the cells, in the order they first ran.
	Policies []string      `json:"policies"`
	Cells    []CellSummary `json:"cells"`
	// Wins counts, per metric and policy, the cells where the policy has
	// the best figure, ties included.
	Wins map[string]map[string]int `json:"wins"`
	// Capacity ranks the policies on each workload's capacity at the
	// SLO; nil when the board has no capacity searches.
	Capacity *CapacitySummary `json:"capacity,omitempty"`
}

// Board is a leaderboard: one Run per (workload, load) cell, normalized as
// the writers print it, and the summary over them.
type Board struct {
	Cells   []Run   `json:"cells"`
	Summary Summary `json:"summary"`
	// Capacity are the capacity searches, one per workload, when the
	// board has them (AddCapacity), as WriteCapacityJSON writes one.
	Capacity []Capacity `json:"capacity,omitempty"`
}

// NewBoard ranks the policies of every cell on each of Metrics and judges
// the policy def on every cell. A cell's workload and load are its
// "workload" and "load" parameters.
func NewBoard(cells []Run, def string) *Board {
	b := &Board{Summary: Summary{Default: def, Tolerance: Tolerance, Metrics: Metrics(), Wins: map[string]map[string]int{}}}
	for _, m := range b.Summary.Metrics {
		b.Summary.Wins[m.Name] = map[string]int{}
	}
	for i := range cells {
		r := cells[i].normalized()
		b.Cells = append(b.Cells, r)
		b.Summary.Cells = append(b.Summary.Cells, b.Summary.add(&r))
	}
	return b
}

// add ranks run r's policies and counts their wins.
func (s *Summary) add(r *Run) CellSummary {
	load, _ := strconv.ParseFloat(r.param("load"), 64)
	cs := CellSummary{Workload: r.param("workload"), Load: load, Metrics: map[string]*Standing{}}
	for _, p := range r.Policies {
		if !slices.Contains(s.Policies, p.Policy) {
			s.Policies = append(s.Policies, p.Policy)
			for _, m := range s.Metrics {
				s.Wins[m.Name][p.Policy] = 0 // every policy has a count
			}
		}
	}
	for _, m := range s.Metrics {
		st := stand(r, m)
		cs.Metrics[m.Name] = st
		if st.Winner != "" {
			for _, p := range append([]string{st.Winner}, st.Tied...) {
				s.Wins[m.Name][p]++
			}
		}
		if q, ok := st.Ratios[s.Default]; ok {
			if cs.DefaultWithin == nil {
				cs.DefaultWithin = map[string]bool{}
			}
			cs.DefaultWithin[m.Name] = math.Abs(q-1) <= Tolerance+1e-9
		}
	}
	return cs
}

// stand ranks the policies of r on m. A policy that rejected more
// requests than another ranks after it whatever its figure, so that no
// policy looks better by shedding load (admission control rejects what
// the fleet cannot take in time; the latencies are over what completed).
func stand(r *Run, m Metric) *Standing {
	var names []string
	var vals []float64
	var rejs []int
	for i := range r.Policies {
		if p := &r.Policies[i]; p.Completed > 0 {
			names, vals, rejs = append(names, p.Policy), append(vals, m.value(p)), append(rejs, p.Rejected)
		}
	}
	return rank(names, vals, func(i, j int) bool {
		if rejs[i] != rejs[j] {
			return rejs[i] < rejs[j]
		}
		if m.Higher {
			return vals[i] > vals[j]
		}
		return vals[i] < vals[j]
	})
}

// rank is the standing of the policies names with figures vals, where
// better(i, j) says the i-th ranks before the j-th.
func rank(names []string, vals []float64, better func(i, j int) bool) *Standing {
	st := &Standing{Ranks: map[string]int{}, Ratios: map[string]float64{}}
	best, second := -1, -1
	for i := range vals {
		if best < 0 || better(i, best) {
			best = i
		}
	}
	if best < 0 {
		return st
	}
	st.Winner, st.Best = names[best], vals[best]
	for i, v := range vals {
		rank := 1
		for j := range vals {
			if better(j, i) {
				rank++
			}
		}
		st.Ranks[names[i]] = rank
		st.Ratios[names[i]] = 1
		if v != st.Best {
			st.Ratios[names[i]] = round6(ratio(v, st.Best))
		}
		tied := !better(best, i)
		switch {
		case tied && i != best:
			st.Tied = append(st.Tied, names[i])
		case !tied && (second < 0 || better(i, second)):
			second = i
		}
	}
	if second >= 0 {
		st.RunnerUp = names[second]
	}
	return st
}

// param returns the value of r's parameter name, empty if absent.
func (r *Run) param(name string) string {
	for _, p := range r.Params {
		if p.Name == name {
			return p.Value
		}
	}
	return ""
}

// WriteBoardJSON writes b as one indented JSON object:
//
//	{"cells": [<one run, as WriteJSON writes it>, ...],
//	 "summary": {"default", "tolerance", "metrics": [{"name", "higher_is_better"}],
//	   "cells": [{"workload", "load", "metrics": {<metric name>: {"winner",
//	     "tied", "best", "runner_up", "ranks": {policy: rank},
//	     "ratios": {policy: figure / best}}}, "default_within_tolerance":
//	     {<metric name>: bool}}],
//	   "wins": {<metric name>: {policy: cells won}},
//	   "capacity": {"levels": [0.99, 0.9], "workloads": [{"workload",
//	     "levels": [<a standing per level, as a metric's>],
//	     "default_within_tolerance": [bool per level]}],
//	     "wins": [{policy: workloads won} per level]}},
//	 "capacity": [<one search per workload, as WriteCapacityJSON writes it>]}
//
// Latency figures ("best") are in milliseconds, hit rates fractions,
// capacities loads (1 = the workload's knee_rate). "capacity" is there
// only when the board has capacity searches (AddCapacity).
func WriteBoardJSON(w io.Writer, b *Board) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(b); err != nil {
		return fmt.Errorf("report json: %w", err)
	}
	return nil
}

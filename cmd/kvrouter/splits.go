package main

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/sim"
)

// Splits of one fleet: `kvrouter sim --prefill-replicas 0,4,8` runs every
// cell once per split of the same --replicas (0: aggregated; P: P prefill
// workers and the rest decoding) at the same arrival rate, and reports
// each cell as one run whose rows name their split, so an aggregated
// fleet and its disaggregated splits are ranked side by side.

// parseSplits parses --prefill-replicas: one count, or several,
// comma-separated, each from 0 to replicas − 1.
func parseSplits(s string, replicas int) ([]int, error) {
	var splits []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 || n >= replicas {
			return nil, fmt.Errorf("--prefill-replicas %q: want counts from 0 to %d (--replicas − 1)", f, replicas-1)
		}
		if !slices.Contains(splits, n) {
			splits = append(splits, n)
		}
	}
	if len(splits) == 0 {
		return nil, errors.New("--prefill-replicas: no count given")
	}
	return splits, nil
}

// splitCells expands each cell of cs into one per split, with the
// policies of policies (a --policies value) that run on it: the P/D peers
// only on a disaggregated split.
func splitCells(cs []sim.Config, splits []int, policies string) []sim.Config {
	out := make([]sim.Config, 0, len(cs)*len(splits))
	for _, c := range cs {
		for _, p := range splits {
			c.PrefillReplicas = p
			c.Policies = policyNames(policies, p > 0)
			if p == 0 {
				c.Policies = slices.DeleteFunc(c.Policies, func(n string) bool { return slices.Contains(route.PDNames(), n) })
			}
			out = append(out, c)
		}
	}
	return out
}

// mergeSplits merges each cell's runs, one per split in the order of
// splits (as splitCells made them), into one run whose rows are named for
// their split (splitName).
func mergeSplits(runs []report.Run, splits []int, replicas int) []report.Run {
	n := len(splits)
	out := make([]report.Run, 0, len(runs)/n)
	for i := 0; i+n <= len(runs); i += n {
		cell := runs[i]
		cell.Params = withSplits(cell.Params, splits)
		cell.Policies = nil
		for k, p := range splits {
			for _, r := range runs[i+k].Policies {
				r.Policy = splitName(r.Policy, p, replicas)
				cell.Policies = append(cell.Policies, r)
			}
		}
		out = append(out, cell)
	}
	return out
}

// mergeSplitCapacities merges one workload's capacities, one per split in
// the order of splits, into one whose rows are named for their split. The
// splits share the load axis: the knee is the whole fleet's, whatever
// its split.
func mergeSplitCapacities(caps []report.Capacity, splits []int, replicas int) report.Capacity {
	out := caps[0]
	out.Params = withSplits(out.Params, splits)
	out.Policies = nil
	for k, p := range splits {
		for _, pc := range caps[k].Policies {
			pc.Policy = splitName(pc.Policy, p, replicas)
			out.Policies = append(out.Policies, pc)
		}
	}
	return out
}

// withSplits is params with prefill_replicas the list of splits.
func withSplits(params []report.Param, splits []int) []report.Param {
	params = slices.DeleteFunc(slices.Clone(params), func(p report.Param) bool { return p.Name == "prefill_replicas" })
	return append(params, report.Param{Name: "prefill_replicas", Value: joinInts(splits)})
}

// splitName is policy's row name on a split of p prefill workers of
// replicas: the policy's own on the aggregated fleet, else with the split,
// "kv-aware 4p+12d".
func splitName(policy string, p, replicas int) string {
	if p == 0 {
		return policy
	}
	return fmt.Sprintf("%s %dp+%dd", policy, p, replicas-p)
}

// joinInts is ns comma-separated.
func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

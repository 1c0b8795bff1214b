package main

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// splitName splits a board row's policy into the policy and its prefill
// replicas: "kv-aware 4p+12d" is kv-aware on 4; "kv-aware" (aggregated) is
// on 0.
var splitName = regexp.MustCompile(`^(\S+)(?: (\d+)p\+\d+d)?$`)

// pdPeers are the P/D policies the disaggregation section compares
// kv-aware with, in its columns' order.
var pdPeers = []string{"pd-round-robin", "llm-d-pd", "dynamo-pd", "llm-d-predicted"}

// pdBest is a policy's best split in one cell: the one of most goodput.
type pdBest struct {
	prefill string
	r       result
	ok      bool
}

// disaggregation: per cell, aggregated kv-aware, then kv-aware's and each
// peer's best split (by goodput), with their tails; then how often
// kv-aware's best split is at least each peer's, and the aggregated fleet
// at least kv-aware's best split.
func disaggregation(outs [][]byte) (string, error) {
	bd, err := decode[boardJSON](outs[0])
	if err != nil {
		return "", err
	}
	if len(bd.Summary.Cells) != len(bd.Cells) {
		return "", fmt.Errorf("the summary's %d cells do not match the %d runs", len(bd.Summary.Cells), len(bd.Cells))
	}
	cell := func(b pdBest) string {
		if !b.ok {
			return "-"
		}
		at := "aggregated"
		if b.prefill != "0" {
			at = b.prefill + "p"
		}
		return fmt.Sprintf("%.2f @ %s (%s / %s)", b.r.Goodput, at, ms(b.r.TTFT.P99), ms(b.r.ITL.P99))
	}
	var b strings.Builder
	b.WriteString("| workload | load | kv-aware aggregated | kv-aware | " + strings.Join(pdPeers, " | ") + " |\n|---|---|---|---|" + strings.Repeat("---|", len(pdPeers)) + "\n")
	var won, compared, aggWins, cells int
	for i, run := range bd.Cells {
		agg, best := pdBest{}, map[string]pdBest{}
		for _, p := range run.Policies {
			m := splitName.FindStringSubmatch(p.Policy)
			if m == nil {
				continue
			}
			name, prefill := m[1], cmp.Or(m[2], "0")
			if prefill == "0" {
				if name == "kv-aware" {
					agg = pdBest{prefill: "0", r: p, ok: true}
				}
				continue
			}
			if cur := best[name]; !cur.ok || p.Goodput > cur.r.Goodput {
				best[name] = pdBest{prefill: prefill, r: p, ok: true}
			}
		}
		kv := best["kv-aware"]
		if !kv.ok {
			continue
		}
		cells++
		for _, peer := range pdPeers {
			if pb := best[peer]; pb.ok {
				compared++
				if kv.r.Goodput >= pb.r.Goodput {
					won++
				}
			}
		}
		if agg.ok && agg.r.Goodput >= kv.r.Goodput {
			aggWins++
		}
		c := bd.Summary.Cells[i]
		row := []string{c.Workload, fmt.Sprint(c.Load), cell(agg), cell(kv)}
		for _, peer := range pdPeers {
			row = append(row, cell(best[peer]))
		}
		fmt.Fprintf(&b, "| %s |\n", strings.Join(row, " | "))
	}
	fmt.Fprintf(&b, "\nkv-aware's best split has at least the goodput of a peer's best split in %d of %d comparisons; the aggregated fleet has at least that of kv-aware's best split in %d of %d cells.\n", won, compared, aggWins, cells)
	return b.String(), nil
}

// planJSON is kvrouter plan's answer for one workload.
type planJSON struct {
	Title    string       `json:"title"`
	Replicas int          `json:"replicas"`
	Rate     float64      `json:"rate"`
	Policies []planPolicy `json:"policies"`
}

// planPolicy is one policy's row of planJSON.
type planPolicy struct {
	Policy   string  `json:"policy"`
	Capacity float64 `json:"capacity"`
	Capped   bool    `json:"capped"`
	Binding  string  `json:"binding"`
	Needed   int     `json:"replicas_needed"`
}

// sizing: per workload, each policy's capacity on the fleet and the
// replicas it needs, in plan's policy order.
func sizing(outs [][]byte) (string, error) {
	plans, err := decode[[]planJSON](outs[0])
	if err != nil {
		return "", err
	}
	if len(plans) == 0 {
		return "", fmt.Errorf("no plan in the output")
	}
	var policies []string
	for _, p := range plans[0].Policies {
		policies = append(policies, p.Policy)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| workload | 1× (req/s) | capacity × on %d replicas: %s | replicas needed at 1×: %s |\n|---|---|---|---|\n",
		plans[0].Replicas, strings.Join(policies, " / "), strings.Join(policies, " / "))
	for _, pl := range plans {
		var capacity, needed []string
		for _, name := range policies {
			i := slices.IndexFunc(pl.Policies, func(p planPolicy) bool { return p.Policy == name })
			if i < 0 {
				capacity, needed = append(capacity, "-"), append(needed, "-")
				continue
			}
			p := pl.Policies[i]
			c := fmt.Sprintf("%.3g", p.Capacity)
			if p.Capped {
				c = "≥ " + c
			}
			n := fmt.Sprint(p.Needed)
			if p.Needed == 0 {
				n = "more than the search's most"
			}
			capacity, needed = append(capacity, c+" ("+p.Binding+")"), append(needed, n)
		}
		fmt.Fprintf(&b, "| %s | %.3g | %s | %s |\n", strings.TrimPrefix(pl.Title, "kvrouter plan: "), pl.Rate,
			strings.Join(capacity, " / "), strings.Join(needed, " / "))
	}
	return b.String(), nil
}

// pdCapacity: per workload, the capacity at 99% and at 90% attainment
// of aggregated kv-aware, and of kv-aware's and each peer's best split
// at each level; then how often kv-aware's best split has at least each
// peer's at each level.
func pdCapacity(outs [][]byte) (string, error) {
	caps, err := decode[[]capacityJSON](outs[0])
	if err != nil {
		return "", err
	}
	const levels = 2 // 99% and 90%
	type best struct {
		load    float64
		prefill string
		ok      bool
	}
	cell := func(bs [levels]best) string {
		var parts []string
		for _, b := range bs {
			if !b.ok {
				parts = append(parts, "-")
				continue
			}
			s := fmt.Sprintf("%.3g", b.load)
			if b.prefill != "0" {
				s += " @ " + b.prefill + "p"
			}
			parts = append(parts, s)
		}
		return parts[0] + " (" + parts[1] + ")"
	}
	var b strings.Builder
	b.WriteString("| workload | kv-aware aggregated | kv-aware | " + strings.Join(pdPeers, " | ") + " |\n|---|---|---|" + strings.Repeat("---|", len(pdPeers)) + "\n")
	var won, compared [levels]int
	for _, c := range caps {
		var agg [levels]best
		bests := map[string]*[levels]best{}
		for _, p := range c.Policies {
			m := splitName.FindStringSubmatch(p.Policy)
			if m == nil {
				continue
			}
			name, prefill := m[1], cmp.Or(m[2], "0")
			bs := bests[name]
			if bs == nil {
				bs = new([levels]best)
				bests[name] = bs
			}
			for k := range min(len(p.At), levels) {
				at := best{load: p.At[k].Load, prefill: prefill, ok: true}
				switch {
				case prefill == "0" && name == "kv-aware":
					agg[k] = at
				case prefill == "0":
				case !bs[k].ok || at.load > bs[k].load:
					bs[k] = at
				}
			}
		}
		kv := bests["kv-aware"]
		if kv == nil || !kv[0].ok {
			continue
		}
		row := []string{c.label(), cell(agg), cell(*kv)}
		for _, peer := range pdPeers {
			var pb [levels]best
			if bests[peer] != nil {
				pb = *bests[peer]
			}
			row = append(row, cell(pb))
			for k := range levels {
				if kv[k].ok && pb[k].ok {
					compared[k]++
					if kv[k].load >= pb[k].load {
						won[k]++
					}
				}
			}
		}
		fmt.Fprintf(&b, "| %s |\n", strings.Join(row, " | "))
	}
	fmt.Fprintf(&b, "\nkv-aware's best split has at least the capacity of a peer's best split in %d of %d comparisons at 99%% attainment, and in %d of %d at 90%%.\n",
		won[0], compared[0], won[1], compared[1])
	return b.String(), nil
}

package main

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"
)

// seedsJSON is --capacity --seeds N --json, as much of it as the tests
// read.
type seedsJSON struct {
	Workload string `json:"workload"`
	SLO      struct {
		TTFTMS float64 `json:"ttft_ms"`
		ITLMS  float64 `json:"itl_ms"`
	} `json:"slo"`
	Seeds    []uint64  `json:"seeds"`
	Levels   []float64 `json:"levels"`
	Policies []struct {
		Policy string       `json:"policy"`
		At     []spreadJSON `json:"at"`
	} `json:"policies"`
	Policy string       `json:"policy"`
	Ratio  []spreadJSON `json:"ratio"`
}

type spreadJSON struct {
	Median, Min, Max float64
	Each             []float64
}

// TestSimCapacitySeeds: --capacity --seeds 3 reports, per policy and
// level, the median, least and greatest of the capacities that three
// separate runs with --seed 1, 2 and 3 find, exactly, and kv-aware's
// ratio to the best other policy of each run likewise (to the 6 digits
// both are written with); under a fixed --slo pair, which each run
// reports as its SLO.
func TestSimCapacitySeeds(t *testing.T) {
	args := append([]string{"--capacity", "--workload", "multi-turn-chat", "--tolerance", "0.1", "--slo", "500ms/40ms", "--json"}, small...)
	out, _, err := runSimArgs(t, append(args, "--seeds", "3")...)
	if err != nil {
		t.Fatal(err)
	}
	var sums []seedsJSON
	if err := json.Unmarshal([]byte(out), &sums); err != nil || len(sums) != 1 {
		t.Fatalf("%v, %d summaries; want one:\n%s", err, len(sums), out)
	}
	sum := sums[0]
	if !slices.Equal(sum.Seeds, []uint64{1, 2, 3}) || sum.SLO.TTFTMS != 500 || sum.SLO.ITLMS != 40 || sum.Policy != "kv-aware" {
		t.Fatalf("seeds %v, SLO %v/%v ms, ratio of %q; want 1, 2, 3, 500/40 ms, kv-aware", sum.Seeds, sum.SLO.TTFTMS, sum.SLO.ITLMS, sum.Policy)
	}
	// load[policy][level] over the seeds, from separate runs.
	load := map[string][][]float64{}
	for _, seed := range sum.Seeds {
		one, _, err := runSimArgs(t, append(args, "--seed", fmt.Sprint(seed))...)
		if err != nil {
			t.Fatal(err)
		}
		var c capacityJSON
		if err := json.Unmarshal([]byte(one), &c); err != nil {
			t.Fatal(err)
		}
		for _, p := range c.Policies {
			if load[p.Policy] == nil {
				load[p.Policy] = make([][]float64, len(c.Levels))
			}
			for k, at := range p.At {
				load[p.Policy][k] = append(load[p.Policy][k], at.Load)
			}
		}
	}
	want := func(xs []float64) spreadJSON {
		s := slices.Clone(xs)
		slices.Sort(s)
		return spreadJSON{Median: s[1], Min: s[0], Max: s[2], Each: xs}
	}
	for _, p := range sum.Policies {
		for k, got := range p.At {
			if w := want(load[p.Policy][k]); got.Median != w.Median || got.Min != w.Min || got.Max != w.Max || !slices.Equal(got.Each, w.Each) {
				t.Errorf("%s at %g: %+v, want %+v from the separate runs", p.Policy, sum.Levels[k], got, w)
			}
		}
	}
	for k, got := range sum.Ratio {
		var qs []float64
		for i := range sum.Seeds {
			best := 0.0
			for name, l := range load {
				if name != "kv-aware" {
					best = max(best, l[k][i])
				}
			}
			qs = append(qs, load["kv-aware"][k][i]/best)
		}
		w := want(qs)
		close := func(a, b float64) bool { return math.Abs(a-b) <= 1e-6 } // each run's loads are written to 6 digits
		if !close(got.Median, w.Median) || !close(got.Min, w.Min) || !close(got.Max, w.Max) {
			t.Errorf("kv-aware ÷ best other at %g: %+v, want %+v from the separate runs", sum.Levels[k], got, w)
		}
	}
}

// TestParseSLOs: --slo takes pairs and derived, and refuses the rest.
func TestParseSLOs(t *testing.T) {
	got, err := parseSLOs("derived, 1s/50ms,2s/100ms")
	if err != nil || len(got) != 3 || got[0].TTFT != 0 || got[1].TTFT != time.Second || got[1].ITL != 50*time.Millisecond || got[2].ITL != 100*time.Millisecond {
		t.Errorf("derived,1s/50ms,2s/100ms: %v, %v", got, err)
	}
	for _, bad := range []string{"1s", "1s/x", "-1s/50ms", ""} {
		if _, err := parseSLOs(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

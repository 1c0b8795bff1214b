package sim

import (
	"math"
	"testing"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/trace"
)

// TestFewest checks the gallop-and-bisect search over replica counts
// against the answer of every threshold predicate on [1, 40], from every
// guess, including thresholds past the ceiling; and that it runs about
// 2·log2 of the distance, not a sweep.
func TestFewest(t *testing.T) {
	const hi = 40
	for want := 1; want <= hi+1; want++ {
		for guess := -1; guess <= hi+2; guess++ {
			runs := 0
			got := fewest(guess, hi, func(n int) bool {
				runs++
				if n < 1 || n > hi {
					t.Fatalf("threshold %d, guess %d: ran %d, outside [1, %d]", want, guess, n, hi)
				}
				return n >= want
			})
			if got != want {
				t.Errorf("threshold %d, guess %d: got %d, want %d", want, guess, got, want)
			}
			if limit := 2*int(math.Ceil(math.Log2(hi))) + 2; runs > limit {
				t.Errorf("threshold %d, guess %d: %d runs, want at most %d", want, guess, runs, limit)
			}
		}
	}
}

// TestPlanMatchesSweep checks Plan's fewest replicas against a brute
// force sweep on a small case: the simulator run in full (Run, at the
// same rate scale of the requests' own rate) at every fleet of 1 to 8
// replicas, the answer the smallest whose share of requests meeting the
// SLO reaches the level. It also checks each policy's capacity is
// Capacity's at that level, and that the case separates the policies
// (else it would check little).
func TestPlanMatchesSweep(t *testing.T) {
	preset, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	w, err := trace.Generate("shared-prefix", trace.GenOptions{Seed: 1, Requests: 200})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Workload: "shared-prefix", Requests: w.Requests, Replicas: 4, Preset: preset,
		Policies: []string{"kv-aware", "least-loaded", "round-robin"}}
	ps := PlanSearch{RateScale: 10, MaxReplicas: 8}
	plan, err := Plan(cfg, ps)
	if err != nil {
		t.Fatal(err)
	}
	caps, err := Capacity(cfg, CapacitySearch{Levels: []float64{DefaultLevels[0]}})
	if err != nil {
		t.Fatal(err)
	}
	needed := map[int]bool{}
	for i, name := range cfg.Policies {
		want := 0
		for n := 1; n <= ps.MaxReplicas && want == 0; n++ {
			c := cfg
			c.Replicas, c.RateScale, c.Policies, c.SLO = n, ps.RateScale, []string{name}, SLO(plan.SLO)
			run, err := Run(c)
			if err != nil {
				t.Fatal(err)
			}
			if run.Policies[0].SLOMet >= DefaultLevels[0] {
				want = n
			}
		}
		got := plan.Policies[i]
		if got.Needed != want {
			t.Errorf("%s: plan needs %d replicas for %g× the rate; the sweep's smallest passing fleet is %d (0: none to %d)",
				name, got.Needed, ps.RateScale, want, ps.MaxReplicas)
		}
		needed[want] = true
		at := caps.Policies[i].At[0]
		if wantCap := at.RateScale; math.Abs(got.Capacity-wantCap) > 1e-9*wantCap || got.Capped != at.Capped {
			t.Errorf("%s: plan capacity %g× (capped %v), Capacity's %g× (capped %v)", name, got.Capacity, got.Capped, wantCap, at.Capped)
		}
		t.Logf("%s: capacity %.3g× on %d replicas, needs %d for %g×", name, got.Capacity, cfg.Replicas, got.Needed, ps.RateScale)
	}
	if len(needed) < 2 {
		t.Errorf("every policy needs the same fleet %v: the case does not test the search", needed)
	}
}

// TestPlanErrors: out-of-range searches are refused with their value.
func TestPlanErrors(t *testing.T) {
	preset, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	w, err := trace.Generate("shared-prefix", trace.GenOptions{Seed: 1, Requests: 20})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Requests: w.Requests, Replicas: 2, Preset: preset, Policies: []string{"round-robin"}}
	for _, ps := range []PlanSearch{{Attainment: 1.5}, {Attainment: -0.1}, {RateScale: -1}, {MaxReplicas: 5000}, {Load: -2}, {Tolerance: -1}} {
		if _, err := Plan(cfg, ps); err == nil {
			t.Errorf("%+v: no error", ps)
		}
	}
}

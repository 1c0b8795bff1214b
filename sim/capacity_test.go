package sim

import (
	"testing"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/trace"
)

// TestGridHighest checks the bracket-and-bisect search against the
// answer of a threshold predicate, from below, above and at the ends of
// the grid.
func TestGridHighest(t *testing.T) {
	g := newGrid(0.02, DefaultMaxLoad)
	for _, want := range []int{g.lo - 1, g.lo, -100, -1, 0, 1, 7, 64, 150, g.hi - 1} {
		runs := 0
		got, capped := g.highest(func(k int) bool { runs++; return k <= want })
		if got != want || capped {
			t.Errorf("threshold %d: got %d (capped %v), want %d", want, got, capped, want)
		}
		if runs > 40 {
			t.Errorf("threshold %d: %d runs, want at most 40", want, runs)
		}
	}
	if got, capped := g.highest(func(int) bool { return true }); got != g.hi || !capped {
		t.Errorf("always passing: got %d (capped %v), want %d capped", got, capped, g.hi)
	}
}

// TestCapacityMatchesSweep checks Capacity's bisection against a brute
// force sweep of the same grid on a small case: every load of the grid
// from the floor up, each run in full, the capacity the last load below
// the first that fails its level. The two must agree exactly.
func TestCapacityMatchesSweep(t *testing.T) {
	preset, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	w, err := trace.Generate("shared-prefix", trace.GenOptions{Seed: 3, Requests: 160, Groups: 8})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Workload: "shared-prefix", Requests: w.Requests, Replicas: 4, Preset: preset,
		Policies: []string{"least-loaded", "kv-aware"}}
	cs := CapacitySearch{Tolerance: 0.2, MaxLoad: 16} // the sweep runs about 35 loads a policy up to its capacity (0.1: 67)
	got, err := Capacity(cfg, cs)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Load = 1
	o, err := prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g := newGrid(cs.Tolerance, cs.MaxLoad)
	for p, name := range cfg.Policies {
		met := map[int]float64{} // a load's attainment, run once for every level: runs are deterministic
		for l, level := range DefaultLevels {
			want := 0.0
			for k := g.lo; k <= g.hi; k++ {
				if _, ok := met[k]; !ok {
					res, err := o.scaled(g.load(k)).run(name)
					if err != nil {
						t.Fatal(err)
					}
					met[k] = report.NewAttainment(g.load(k), res.samples, report.SLO(o.cfg.SLO)).Met
				}
				if met[k] < level {
					break
				}
				want = g.load(k)
			}
			if at := got.Policies[p].At[l]; at.Load != want {
				t.Errorf("%s at %g: bisection %g, sweep %g", name, level, at.Load, want)
			} else {
				t.Logf("%s at %g: capacity %.3g", name, level, want)
			}
		}
	}
}

package sim

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvrouter/kvrouter/report"
)

// Defaults of CapacitySearch's zero fields.
const (
	// DefaultTolerance is the relative step of the grid of loads a
	// capacity search runs on.
	DefaultTolerance = 0.02
	// DefaultMaxLoad is the highest load a capacity search tries.
	DefaultMaxLoad = 64.0
	// minLoad is the lowest load a capacity search tries: below it a
	// policy's capacity is reported as 0.
	minLoad = 1.0 / 64
)

// DefaultLevels are the attainments a capacity search finds by default:
// the 99% point, and the 90% point beside it.
var DefaultLevels = []float64{0.99, 0.90}

// CapacitySearch is how Capacity searches.
type CapacitySearch struct {
	// Levels are the shares of requests, 0..1, that must meet the SLO;
	// empty means DefaultLevels.
	Levels []float64
	// Tolerance is the relative step of the grid of loads searched, the
	// loads (1 + Tolerance)^k for integers k: a capacity C meets its level
	// and C × (1 + Tolerance) does not. Zero means DefaultTolerance.
	Tolerance float64
	// MaxLoad is the highest load tried; zero means DefaultMaxLoad.
	MaxLoad float64
	// Class, if set, counts only the requests of that SLO class
	// (trace.Request.SLO) toward the levels: the capacity at which the
	// class meets its own SLO, whatever the others' fate.
	Class string
	// Progress, if set, is called after every run with the policy and
	// the load it ran at.
	Progress func(policy string, load float64)
}

// Capacity finds, for every policy of cfg, the highest load (Config.Load)
// at which at least each level's share of the requests meet the SLO: the
// capacity at that SLO. Each run is deterministic, so a load either meets
// a level or does not; the search brackets the capacity on a geometric
// grid of loads by doubling its step from load 1, then bisects the
// bracket down to adjacent grid points (capacity, then the first load
// above it that fails). It assumes attainment falls as the load grows;
// where it does not, it finds a load that passes next to one that fails,
// and the curve of every load it ran is in the result. cfg.Load is
// ignored.
func Capacity(cfg Config, cs CapacitySearch) (report.Capacity, error) {
	cs = cs.withDefaults()
	cfg.Load, cfg.RateScale = 1, 0
	o, err := prepare(cfg)
	if err != nil {
		return report.Capacity{}, err
	}
	slo, ok := report.SLO(o.cfg.SLO), false
	out := report.Capacity{Title: "kvrouter capacity: " + o.cfg.Workload, Params: o.params(), SLO: slo,
		KneeRate: o.knee, OwnRate: o.own, Tolerance: cs.Tolerance, Levels: cs.Levels}
	if cs.Class != "" {
		if slo, ok = o.classSLO(cs.Class); !ok {
			return report.Capacity{}, fmt.Errorf("sim: no request of SLO class %q in %s", cs.Class, o.cfg.Workload)
		}
		out.SLO = slo
		out.Params = append(out.Params, report.Param{Name: "slo_class", Value: cs.Class})
	}
	var tops []deciding
	for _, name := range o.cfg.Policies {
		pc, top, err := o.capacity(name, cs, slo)
		if err != nil {
			return report.Capacity{}, err
		}
		out.Policies = append(out.Policies, pc)
		tops = append(tops, top)
	}
	o.steady(&out, tops)
	return out, nil
}

func (cs CapacitySearch) withDefaults() CapacitySearch {
	if len(cs.Levels) == 0 {
		cs.Levels = DefaultLevels
	}
	cs.Levels = slices.Clone(cs.Levels)
	slices.SortFunc(cs.Levels, func(a, b float64) int { return -cmpFloat(a, b) })
	if cs.Tolerance <= 0 {
		cs.Tolerance = DefaultTolerance
	}
	if cs.MaxLoad <= 0 {
		cs.MaxLoad = DefaultMaxLoad
	}
	return cs
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// grid is the loads of a search: load(k) = (1 + tol)^k, for k in
// [lo, hi].
type grid struct {
	step   float64
	lo, hi int
}

func newGrid(tol, maxLoad float64) grid {
	s := math.Log1p(tol)
	return grid{step: s, lo: int(math.Floor(math.Log(minLoad) / s)), hi: int(math.Ceil(math.Log(maxLoad) / s))}
}

func (g grid) load(k int) float64 { return math.Exp(float64(k) * g.step) }

// highest is the highest k in [g.lo, g.hi] with pass(k), searched from
// k = 0 by doubling steps and then bisection; g.lo − 1 when even g.lo
// fails, and capped (true) when g.hi passes.
func (g grid) highest(pass func(k int) bool) (k int, capped bool) {
	lo, hi := 0, 0 // lo passes, hi fails, once found
	if pass(0) {
		for step := 1; ; step *= 2 {
			next := min(lo+step, g.hi)
			if !pass(next) {
				hi = next
				break
			}
			lo = next
			if next == g.hi {
				return g.hi, true
			}
		}
	} else {
		hi = 0
		for step := 1; ; step *= 2 {
			next := max(hi-step, g.lo)
			if pass(next) {
				lo = next
				break
			}
			hi = next
			if next == g.lo {
				return g.lo - 1, false
			}
		}
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if pass(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, false
}

// capacity searches one policy's capacity at every level of cs, and
// returns it with the run that decided its highest (steady.go).
func (o *outcome) capacity(name string, cs CapacitySearch, slo report.SLO) (report.PolicyCapacity, deciding, error) {
	g := newGrid(cs.Tolerance, cs.MaxLoad)
	runs := map[int]report.Attainment{}
	walls := map[int]time.Duration{} // each run's mean time in the fleet
	var err error
	attain := func(k int) report.Attainment {
		if a, ok := runs[k]; ok || err != nil {
			return a
		}
		load := g.load(k)
		var res *result
		res, err = o.scaled(load).run(name)
		if err != nil {
			return report.Attainment{}
		}
		a := report.NewAttainment(load, classSamples(res.samples, cs.Class), slo)
		runs[k], walls[k] = a, meanE2E(res.samples)
		if cs.Progress != nil {
			cs.Progress(name, load)
		}
		return a
	}
	pc := report.PolicyCapacity{Policy: name}
	var top deciding
	for _, level := range cs.Levels {
		k, capped := g.highest(func(k int) bool { return attain(k).Met >= level })
		if err != nil {
			return pc, top, err
		}
		kd := k + 1 // the failing run above the capacity, which the search ran
		if capped {
			kd = k
		}
		if l := g.load(kd); l > top.load {
			top = deciding{load: l, w: walls[kd]}
		}
		lc := report.LevelCapacity{Level: level, Capped: capped}
		if k >= g.lo {
			lc.Load = g.load(k)
			lc.Rate = lc.Load * o.knee
			if o.own > 0 {
				lc.RateScale = lc.Rate / o.own
			}
		}
		pc.At = append(pc.At, lc)
	}
	for _, a := range runs {
		pc.Curve = append(pc.Curve, a)
	}
	slices.SortFunc(pc.Curve, func(a, b report.Attainment) int { return cmpFloat(a.Load, b.Load) })
	pc.Binding = report.Binding(pc.Curve, cs.Levels[0])
	return pc, top, nil
}

// classSamples is the samples of class, or all of them when class is
// empty.
func classSamples(samples []report.Sample, class string) []report.Sample {
	if class == "" {
		return samples
	}
	var out []report.Sample
	for _, s := range samples {
		if s.Class == class {
			out = append(out, s)
		}
	}
	return out
}

// scaled is o at another load: o's jobs, prepared at load 1 (arrivals
// from time 0), with their arrival times and the fleet events divided by
// load.
func (o *outcome) scaled(load float64) *outcome {
	s := *o
	s.cfg.Load = load
	s.rate = load * o.knee
	s.jobs = slices.Clone(o.jobs)
	for i := range s.jobs {
		s.jobs[i].at = time.Duration(float64(o.jobs[i].at) / load)
	}
	s.cfg.fleet = slices.Clone(o.cfg.fleet)
	for i := range s.cfg.fleet {
		s.cfg.fleet[i].at = time.Duration(float64(o.cfg.fleet[i].at) / load)
	}
	return &s
}

package sim

import (
	"fmt"
	"math"
	"slices"

	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/residency"
)

// PlanSearch is how Plan searches. The zero value searches the 99% point
// at the requests' own rate.
type PlanSearch struct {
	// Attainment is the share of requests, 0..1, that must meet the SLO;
	// zero means DefaultLevels[0] (0.99).
	Attainment float64
	// RateScale is the traffic the fewest-replicas search serves, as a
	// multiple of the requests' own arrival rate; zero means 1.
	RateScale float64
	// Load, when positive, makes 1× (what Capacity and RateScale
	// multiply) this multiple of the given fleet's knee rate, the rate
	// Config.Load measures, instead of the requests' own arrival rate;
	// zero means their own rate, or load 1 when they all arrive at once.
	Load float64
	// Tolerance is the capacity search's relative step
	// (CapacitySearch.Tolerance); zero means DefaultTolerance.
	Tolerance float64
	// MaxReplicas is the most replicas the fewest-replicas search tries;
	// zero means max(4 × Config.Replicas, 64), at most
	// residency.MaxReplicasLimit.
	MaxReplicas int
	// Progress, if set, is called after every run with the policy and
	// what ran: "@ 1.2×" (a load) or "12 replicas".
	Progress func(policy, run string)
}

func (ps PlanSearch) withDefaults(replicas int) (PlanSearch, error) {
	if ps.Attainment == 0 {
		ps.Attainment = DefaultLevels[0]
	}
	if ps.RateScale == 0 {
		ps.RateScale = 1
	}
	if ps.MaxReplicas == 0 {
		ps.MaxReplicas = min(max(4*replicas, 64), residency.MaxReplicasLimit)
	}
	switch {
	case ps.Attainment <= 0 || ps.Attainment > 1 || math.IsNaN(ps.Attainment):
		return ps, fmt.Errorf("plan: attainment %g: want a share in (0, 1]", ps.Attainment)
	case ps.RateScale < 0 || math.IsNaN(ps.RateScale) || math.IsInf(ps.RateScale, 0):
		return ps, fmt.Errorf("plan: rate scale %g: want a positive multiple", ps.RateScale)
	case ps.MaxReplicas < 1 || ps.MaxReplicas > residency.MaxReplicasLimit:
		return ps, fmt.Errorf("plan: max replicas %d: want 1 to %d", ps.MaxReplicas, residency.MaxReplicasLimit)
	case ps.Load < 0 || math.IsNaN(ps.Load) || math.IsInf(ps.Load, 0):
		return ps, fmt.Errorf("plan: load %g: want a positive multiple of the knee, or 0", ps.Load)
	case ps.Tolerance < 0:
		return ps, fmt.Errorf("plan: tolerance %g < 0", ps.Tolerance)
	}
	return ps, nil
}

// Plan sizes cfg's fleet for each of its policies at the SLO: the most
// traffic cfg.Replicas serve with at least ps.Attainment of the requests
// meeting the SLO (Capacity's search, at that one level), as a multiple
// of the requests' own arrival rate; and the fewest replicas that serve
// ps.RateScale times that rate so (fewest). With ps.Load, or for
// requests that all arrive at once (no rate of their own), the multiples
// are of ps.Load (else 1) times the rate at which cfg's fleet, balanced
// and caching nothing, reaches its knee (Config.Load). cfg.Load and
// cfg.RateScale are ignored.
func Plan(cfg Config, ps PlanSearch) (report.Plan, error) {
	cfg.Load, cfg.RateScale = 1, 0
	o, err := prepare(cfg)
	if err != nil {
		return report.Plan{}, err
	}
	if ps, err = ps.withDefaults(o.cfg.Replicas); err != nil {
		return report.Plan{}, err
	}
	slo := report.SLO(o.cfg.SLO)
	out := report.Plan{Title: "kvrouter plan: " + o.cfg.Workload, Params: o.params(), SLO: slo,
		Attainment: ps.Attainment, Replicas: o.cfg.Replicas, Rate: o.own, RateScale: ps.RateScale,
		MaxReplicas: ps.MaxReplicas, Tolerance: ps.Tolerance, Basis: report.BasisOwn}
	if ps.Load <= 0 && o.own <= 0 {
		ps.Load = 1
	}
	if ps.Load > 0 {
		out.Rate, out.Basis, out.Load = ps.Load*o.knee, report.BasisKnee, ps.Load
	}
	if out.Tolerance == 0 {
		out.Tolerance = DefaultTolerance
	}
	fs := fleetSearch{base: o, ps: ps, slo: slo, runs: map[int]*outcome{}}
	for _, name := range o.cfg.Policies {
		pp, err := fs.plan(name, out.Rate)
		if err != nil {
			return report.Plan{}, err
		}
		out.Policies = append(out.Policies, pp)
	}
	out.Compare()
	return out, nil
}

// fleetSearch is one Plan's searches: the outcome prepared at the given
// fleet and, by replica count, at the fixed rate (shared by the policies).
type fleetSearch struct {
	base *outcome
	ps   PlanSearch
	slo  report.SLO
	runs map[int]*outcome
}

// plan searches one policy: its capacity on the given fleet, then the
// fewest replicas at the fixed rate, from the guess the capacity gives.
func (fs *fleetSearch) plan(name string, rate float64) (report.PolicyPlan, error) {
	cs := CapacitySearch{Levels: []float64{fs.ps.Attainment}, Tolerance: fs.ps.Tolerance}
	cs = cs.withDefaults()
	if fs.ps.Progress != nil {
		cs.Progress = func(policy string, load float64) {
			fs.ps.Progress(policy, fmt.Sprintf("@ %.3g×", load*fs.base.knee/rate))
		}
	}
	pc, _, err := fs.base.capacity(name, cs, fs.slo)
	if err != nil {
		return report.PolicyPlan{}, err
	}
	pp := report.PolicyPlan{Policy: name, Binding: pc.Binding, Capped: pc.At[0].Capped,
		Capacity: pc.At[0].Load * fs.base.knee / rate}
	for _, a := range pc.Curve {
		a.Load = a.Load * fs.base.knee / rate
		pp.Load = append(pp.Load, a)
	}
	r0 := fs.base.cfg.Replicas
	guess := r0
	if pp.Capacity > 0 {
		guess = int(math.Ceil(float64(r0) * fs.ps.RateScale / pp.Capacity))
	}
	runs := map[int]report.Attainment{}
	pass := func(n int) bool {
		if err != nil {
			return false
		}
		var a report.Attainment
		if a, err = fs.attain(name, n); err != nil {
			return false
		}
		runs[n] = a
		if fs.ps.Progress != nil {
			fs.ps.Progress(name, fmt.Sprintf("%d replicas", n))
		}
		return a.Met >= fs.ps.Attainment
	}
	n := fewest(guess, fs.ps.MaxReplicas, pass)
	if err != nil {
		return pp, err
	}
	if n <= fs.ps.MaxReplicas {
		pp.Needed = n
	}
	for k, a := range runs {
		pp.Fleet = append(pp.Fleet, report.FleetAttainment{Replicas: k, Attainment: a})
	}
	slices.SortFunc(pp.Fleet, func(a, b report.FleetAttainment) int { return a.Replicas - b.Replicas })
	if a, ok := runs[n-1]; ok {
		pp.FleetBinding = report.Binding([]report.Attainment{a}, fs.ps.Attainment)
	}
	return pp, nil
}

// attain runs policy name on n replicas at the fixed rate: RateScale
// times the requests' own rate, or, with a Load, RateScale times the
// given fleet's rate at that load (the knee rate is one replica's times
// the replicas, so n replicas run at Load × RateScale × given / n).
func (fs *fleetSearch) attain(name string, n int) (report.Attainment, error) {
	o, ok := fs.runs[n]
	if !ok {
		cfg := fs.base.cfg
		cfg.Replicas, cfg.Load, cfg.RateScale = n, 0, fs.ps.RateScale
		if fs.ps.Load > 0 {
			cfg.Load = fs.ps.Load * fs.ps.RateScale * float64(fs.base.cfg.Replicas) / float64(n)
		}
		var err error
		if o, err = prepare(cfg); err != nil {
			return report.Attainment{}, err
		}
		fs.runs[n] = o
	}
	res, err := o.run(name)
	if err != nil {
		return report.Attainment{}, err
	}
	return report.NewAttainment(fs.ps.RateScale, res.samples, fs.slo), nil
}

// fewest is the smallest n in [1, hi] with pass(n), for a pass that is
// false below some n and true from it on: from guess (clamped to
// [1, hi]) it steps down while pass holds, or up while it fails, by
// doubling steps, then bisects the bracket. It returns hi + 1 when even
// pass(hi) is false. Where pass is not monotone it finds an n that
// passes above one that fails (or n = 1).
func fewest(guess, hi int, pass func(n int) bool) int {
	n := min(max(guess, 1), hi)
	lo, up := 0, n // lo fails (0: below the range), up passes
	if pass(n) {
		for step := 1; up-step >= 1; step *= 2 {
			if !pass(up - step) {
				lo = up - step
				break
			}
			up -= step
		}
	} else {
		lo = n
		for step := 1; ; step *= 2 {
			if lo == hi {
				return hi + 1
			}
			next := min(lo+step, hi)
			if pass(next) {
				up = next
				break
			}
			lo = next
		}
	}
	for up-lo > 1 {
		mid := lo + (up-lo)/2
		if pass(mid) {
			up = mid
		} else {
			lo = mid
		}
	}
	return up
}

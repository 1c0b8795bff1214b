package demo

import (
	"fmt"
	"math"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/sim"
	"github.com/kvrouter/kvrouter/trace"
)

// sizingPolicies are the policies the closing line compares.
var sizingPolicies = []string{"kv-aware", "round-robin"}

// Sizing is the fleet sizing the demo ends with: kvrouter plan's
// computation (sim.Plan) on the demo's own requests, for kv-aware and
// round-robin, on the demo's preset and fleet. At the demo's own rate
// the fleet idles (one replica of either policy serves it), so it sizes
// for the most traffic the demo's fleet serves under round-robin.
type Sizing struct {
	// Plan is the plan at RateScale times the requests' own rate; its
	// SLO is the simulator's, derived from the preset and the requests
	// (sim.SLO).
	Plan report.Plan
	// RateScale is round-robin's capacity on the demo's fleet, a multiple
	// of the requests' own rate, rounded down to two decimals (0: none,
	// and the plan is at their own rate).
	RateScale float64
	// Wall is the wall time the computation took.
	Wall time.Duration
}

// size plans cfg's fleet on reqs (sim.Plan: the simulator, on a virtual
// clock; well under a second for the demo's few hundred requests): first
// round-robin's capacity on cfg.Replicas, then the replicas each policy
// needs for that traffic.
func size(cfg Config, reqs []trace.Request) (*Sizing, error) {
	t0 := time.Now()
	preset, err := engine.Preset(cfg.Preset)
	if err != nil {
		return nil, err
	}
	if cfg.KVBlocks > 0 {
		preset.NumBlocks = cfg.KVBlocks
	}
	sc := sim.Config{Workload: cfg.Workload, Requests: reqs, Replicas: cfg.Replicas, PresetName: cfg.Preset,
		Preset: preset, Policies: sizingPolicies[1:], Seed: cfg.Seed}
	caps, err := sim.Capacity(sc, sim.CapacitySearch{Levels: sim.DefaultLevels[:1]})
	if err != nil {
		return nil, fmt.Errorf("sizing: %w", err)
	}
	s := &Sizing{RateScale: math.Floor(100*caps.Policies[0].At[0].RateScale) / 100}
	sc.Policies = sizingPolicies
	if s.Plan, err = sim.Plan(sc, sim.PlanSearch{RateScale: s.RateScale}); err != nil {
		return nil, fmt.Errorf("sizing: %w", err)
	}
	s.Wall = time.Since(t0)
	return s, nil
}

// Line is the closing line: the most traffic the demo's fleet serves at
// the SLO under round-robin, the replicas kv-aware and round-robin each
// need for it, and the command that recomputes it.
func (s *Sizing) Line() string {
	p := &s.Plan
	kv, rr := p.Policies[0], p.Policies[1]
	need := func(n int) string {
		if n == 0 {
			return fmt.Sprintf("more than %d", p.MaxReplicas)
		}
		return fmt.Sprint(n)
	}
	slo := fmt.Sprintf("%g%% of requests within TTFT %v and mean ITL %v", 100*p.Attainment, p.SLO.TTFT, p.SLO.ITL)
	traffic := fmt.Sprintf("%d round-robin replicas serve at most %g× this workload's traffic with %s; at that traffic", p.Replicas, s.RateScale, slo)
	if s.RateScale == 0 {
		traffic = fmt.Sprintf("to serve this workload's traffic with %s,", slo)
	}
	cmd := ""
	if w := p.Param("workload"); w == ChatWorkload {
		cmd = fmt.Sprintf("; recompute it with kvrouter plan --workload %s --requests %s --replicas %d --load 0", w, p.Param("requests"), p.Replicas)
		if seed := p.Param("seed"); seed != "1" {
			cmd += " --seed " + seed
		}
		if s.RateScale > 0 {
			cmd += fmt.Sprintf(" --rate-scale %g", s.RateScale)
		}
	}
	return fmt.Sprintf("Sizing: %s kv-aware needs %s replicas, round-robin %s (simulated in %v%s).",
		traffic, need(kv.Needed), need(rr.Needed), s.Wall.Round(time.Millisecond), cmd)
}

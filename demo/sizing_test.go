package demo

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/sim"
)

// TestSizing: the demo's closing sizing on its default workload and fleet
// is kvrouter plan's computation (sim.Plan on the same requests, at
// round-robin's capacity on the demo's fleet, which round-robin then
// needs at most that fleet for), says what both policies need and how to
// recompute it, and stays cheap: under 2 s of wall time (measured,
// logged).
func TestSizing(t *testing.T) {
	cfg := Config{}.withDefaults()
	cfg.Seed = 1
	reqs, err := Workload(cfg.Workload, cfg.Requests, cfg.Seed, 90*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	s, err := size(cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	line := s.Line()
	t.Logf("%s", line)
	preset, err := engine.Preset(cfg.Preset)
	if err != nil {
		t.Fatal(err)
	}
	want, err := sim.Plan(sim.Config{Workload: cfg.Workload, Requests: reqs, Replicas: cfg.Replicas, PresetName: cfg.Preset,
		Preset: preset, Policies: []string{"kv-aware", "round-robin"}, Seed: 1}, sim.PlanSearch{RateScale: s.RateScale})
	if err != nil {
		t.Fatal(err)
	}
	for i, q := range want.Policies {
		got := s.Plan.Policies[i]
		if got.Policy != q.Policy || got.Needed != q.Needed || got.Needed == 0 {
			t.Errorf("%s needs %d replicas in the demo's sizing, %s %d in sim.Plan's; want the same, found", got.Policy, got.Needed, q.Policy, q.Needed)
		}
		if !strings.Contains(line, q.Policy) {
			t.Errorf("line does not name %s: %s", q.Policy, line)
		}
	}
	if rr := want.Policies[1]; s.RateScale <= 0 || rr.Needed > cfg.Replicas {
		t.Errorf("sized for %g× the traffic, where round-robin needs %d replicas; want round-robin's capacity on the demo's %d", s.RateScale, rr.Needed, cfg.Replicas)
	}
	if !strings.Contains(line, fmt.Sprintf("kvrouter plan --workload demo-chat --requests 240 --replicas 4 --load 0 --rate-scale %g", s.RateScale)) {
		t.Errorf("line does not give the command that recomputes it: %s", line)
	}
}

// BenchmarkSize is the demo's sizing, which the demo runs before its
// replays: its time is a benchmark's figure, not a test's threshold,
// since a loaded machine stretches it (budget: 2 s on a quiet core).
func BenchmarkSize(b *testing.B) {
	cfg := Config{}.withDefaults()
	cfg.Seed = 1
	reqs, err := Workload(cfg.Workload, cfg.Requests, cfg.Seed, 90*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := size(cfg, reqs); err != nil {
			b.Fatal(err)
		}
	}
}

package sim

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/trace"
)

// cacheBlind rewrites reqs so that no two share a block and all arrive
// at once (the simulator then spaces them evenly at the load's rate):
// the same prompt and output lengths, each prompt one segment of its
// own.
func cacheBlind(reqs []trace.Request) []trace.Request {
	out := make([]trace.Request, len(reqs))
	for i, r := range reqs {
		r.Segments = []trace.Segment{{ID: uint64(1<<40 + i), Tokens: r.Prompt}}
		r.Session, r.Tenant, r.At = "", "", 0
		out[i] = r
	}
	return out
}

// TestLoadOneIsTheKnee checks the load axis against what it stands for:
// at load 1 a balanced fleet that caches nothing, fed at an even rate,
// is at the knee of the SLO (kneeRate). On every built-in workload, its
// prompts made unique so that nothing is reused and its arrivals evenly
// spaced, least-loaded's capacity at the 90% point is within [0.55, 1.1]
// of load 1, and at the 99% point below 1.05: the fluid knee is where the
// mean request reaches a bound, so the tail misses it a little earlier.
// (A trace's own bursts lower every policy's capacity below the axis:
// they are what the capacity search measures, not what the axis is.)
func TestLoadOneIsTheKnee(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a capacity search per workload")
	}
	preset, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join("..", "..", "shared", "traces")
	for _, name := range trace.Names() {
		t.Run(name, func(t *testing.T) {
			w, err := trace.Generate(name, trace.GenOptions{Seed: 1, Requests: 1200, TraceDir: dir, FleetKVTokens: FleetKVTokens(preset, 8)})
			if errors.Is(err, os.ErrNotExist) {
				t.Skipf("trace not here: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			c, err := Capacity(Config{Workload: name, Requests: cacheBlind(w.Requests), Replicas: 8, Preset: preset,
				Policies: []string{"least-loaded"}}, CapacitySearch{Tolerance: 0.05})
			if err != nil {
				t.Fatal(err)
			}
			at := c.Policies[0].At
			t.Logf("%s: least-loaded, nothing cached, even arrivals: 99%% at load %.3g, 90%% at %.3g (load 1 = %.3g req/s), binds %s",
				name, at[0].Load, at[1].Load, c.KneeRate, c.Policies[0].Binding)
			if at[1].Load < 0.55 || at[1].Load > 1.1 {
				t.Errorf("90%% point at load %.3g, want within [0.55, 1.1]", at[1].Load)
			}
			if at[0].Load > 1.05 {
				t.Errorf("99%% point at load %.3g, want below 1.05", at[0].Load)
			}
		})
	}
}

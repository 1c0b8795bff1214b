package realengine

import (
	"context"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/sim"
	"github.com/kvrouter/kvrouter/trace"
)

// calibrated builds kvrouter, runs `kvrouter calibrate` against a fresh
// llama-server of the suite's shape, as a user would, and returns the
// preset file it wrote, loaded.
func calibrated(t *testing.T) engine.Config {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "kvrouter")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/kvrouter")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/kvrouter: %v\n%s", err, out)
	}
	r := startReplica(t)
	path := filepath.Join(dir, "llamacpp.yaml")
	// Prompts of up to 512 of calibrate's words: about 2,500 tokens of
	// the model's tokenizer, within a slot's 4,096.
	cal := exec.CommandContext(ctx, bin, "calibrate", "--backend", r.URL, "--out", path, "--sizes", "64,128,256,512")
	if out, err := cal.CombinedOutput(); err != nil {
		t.Fatalf("kvrouter calibrate: %v\n%s", err, out)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kvrouter calibrate --backend %s wrote:\n%s", r.URL, b)
	p, err := engine.LoadPreset(path)
	if err != nil {
		t.Fatal(err)
	}
	if p.Kind != engine.KindLlamaCpp || p.MaxNumSeqs != slots {
		t.Fatalf("calibrated preset of engine %q with %d slots, want llamacpp with %d", p.Kind, p.MaxNumSeqs, slots)
	}
	return p
}

// tiePoints is how close, in points of hit rate, two policies are on the
// real fleet for their order not to count: the simulator is held to 3
// points per policy, so it cannot be asked to order closer ones.
const tiePoints = 3

// simPoints is how far, in points, the simulator's hit rate of a policy
// may be from the real fleet's.
const simPoints = 5

// TestCalibratedSim: `kvrouter calibrate` against a llama-server writes a
// llama.cpp preset with which the simulator, on the suite's workloads
// (the same requests, the same fleet), ranks the policies on hit rate as
// the real fleet does (policies within tiePoints of each other on the
// real fleet count as tied), every policy's hit rate within simPoints of
// the engines' own count. The goal is 3 points; the real fleet's own
// hit rate varies by as much from run to run on a loaded host
// (session-hash on the shared documents: 67.0%, 67.1%, 70.0% in three
// runs, the simulator 70.4%), so the test holds 5 and logs the gap.
func TestCalibratedSim(t *testing.T) {
	build(t)
	preset := calibrated(t)
	for _, w := range []workload{chatWorkload, sharedWorkload} {
		real := runsOf(t, w)
		// The workload counts words; the engines, tokens (about 2.5 a
		// word, and the chat template's): the simulator is given the
		// workload in the engines' tokens, every segment scaled by the
		// ratio of the prompt tokens the engines counted to the words sent.
		ratio := real["session-hash"].engines.Prompt / float64(promptTokens(w.reqs))
		res, err := sim.Run(sim.Config{Workload: w.name, Requests: scaled(w.reqs, ratio), Replicas: fleetSize, Preset: preset, Policies: policies})
		if err != nil {
			t.Fatal(err)
		}
		simHit := map[string]float64{}
		for _, p := range res.Policies {
			simHit[p.Policy] = p.HitRate
		}
		t.Logf("%s: hit rate, real fleet against `kvrouter sim` on the calibrated preset (%.2f engine tokens a word):", w.name, ratio)
		for _, p := range policies {
			rh, sh := real[p].engines.hitRate(), simHit[p]
			t.Logf("  %-13s real %5.1f%%  sim %5.1f%%  (%+.1f points)", p, 100*rh, 100*sh, 100*(sh-rh))
			if math.Abs(sh-rh) > simPoints/100.0 {
				t.Errorf("%s, %s: the simulator's hit rate %.1f%% is more than %d points from the real fleet's %.1f%%", w.name, p, 100*sh, simPoints, 100*rh)
			}
		}
		for _, p := range policies {
			for _, q := range policies {
				if real[p].engines.hitRate()-real[q].engines.hitRate() > tiePoints/100.0 && simHit[p] <= simHit[q] {
					t.Errorf("%s: the real fleet ranks %s above %s on hit rate (%.1f%% > %.1f%%), the simulator does not (%.1f%%, %.1f%%)",
						w.name, p, q, 100*real[p].engines.hitRate(), 100*real[q].engines.hitRate(), 100*simHit[p], 100*simHit[q])
				}
			}
		}
	}
}

// promptTokens is the prompt tokens of reqs.
func promptTokens(reqs []trace.Request) int {
	n := 0
	for _, r := range reqs {
		n += r.Prompt
	}
	return n
}

// scaled is reqs with every segment's tokens multiplied by ratio.
func scaled(reqs []trace.Request, ratio float64) []trace.Request {
	out := make([]trace.Request, len(reqs))
	for i, r := range reqs {
		r.Segments = slices.Clone(r.Segments)
		r.Prompt = 0
		for k := range r.Segments {
			r.Segments[k].Tokens = max(int(math.Round(float64(r.Segments[k].Tokens)*ratio)), 1)
			r.Prompt += r.Segments[k].Tokens
		}
		out[i] = r
	}
	return out
}

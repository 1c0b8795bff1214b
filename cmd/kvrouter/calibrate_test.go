package main

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/engine"
)

// calibrateTolerance is how close calibrate's rates must come to those of
// the engine it measures, relatively.
const calibrateTolerance = 0.05

// TestCalibrate: kvrouter calibrate against an emulated engine, whose
// rates are known (its preset), writes a preset file whose measured rates
// are within calibrateTolerance of them, and whose KV geometry is the
// engine's. The times are the engine's own (its /metrics histograms), so
// the machine's load does not enter them.
func TestCalibrate(t *testing.T) {
	want, err := engine.Preset("qwen3-32b-2xh100")
	if err != nil {
		t.Fatal(err)
	}
	s, err := emulator.Start(emulator.Config{Model: "m", Preset: "qwen3-32b-2xh100", TimeScale: 0.05, KVBlocks: 5000}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	out := filepath.Join(t.TempDir(), "mine.yaml")
	if err := runCalibrate(context.Background(), []string{"--backend", s.URL(), "--out", out}); err != nil {
		t.Fatal(err)
	}
	got, err := engine.LoadPreset(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		name      string
		got, want time.Duration
	}{
		{"step-overhead", got.StepOverhead, want.StepOverhead},
		{"prefill-per-token", got.PrefillPerToken, want.PrefillPerToken},
		{"attn-per-mpairs", got.AttnPerMPairs, want.AttnPerMPairs},
		{"decode-step", got.DecodeStep, want.DecodeStep},
	} {
		rel := math.Abs(float64(r.got-r.want)) / float64(r.want)
		t.Logf("%s: measured %v, the engine's %v (%.2f%%)", r.name, r.got, r.want, 100*rel)
		if rel > calibrateTolerance {
			t.Errorf("%s: measured %v, the engine's %v: off by %.1f%%, want within %.0f%%", r.name, r.got, r.want, 100*rel, 100*calibrateTolerance)
		}
	}
	if got.NumBlocks != 5000 || got.BlockSize != want.BlockSize {
		t.Errorf("geometry %d blocks of %d, want the engine's 5000 of %d", got.NumBlocks, got.BlockSize, want.BlockSize)
	}
}

func TestCalibrateFlags(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--backend", "http://127.0.0.1:1", "--out", "x.json"},
		{"--backend", "http://127.0.0.1:1", "--sizes", "1,2"},
	} {
		var ue *usageError
		if err := runCalibrate(context.Background(), args); !errors.As(err, &ue) {
			t.Errorf("%q: got %v, want a usage error", args, err)
		}
	}
}

// TestSimPresetFile: kvrouter sim on a preset file simulates that engine:
// a slower prefill in the file gives a longer mean TTFT than its base at
// the same arrival times, and a file that is not a preset is a usage error.
func TestSimPresetFile(t *testing.T) {
	args := []string{"--workload", "shared-prefix", "--load", "0", "--json", "--requests", "48", "--replicas", "2", "--policies", "round-robin"}
	ttft := func(extra ...string) float64 {
		t.Helper()
		out, _, err := runSimArgs(t, append(append([]string{}, args...), extra...)...)
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			Policies []struct {
				TTFT struct {
					Mean float64 `json:"mean"`
				} `json:"ttft_ms"`
			} `json:"policies"`
		}
		if err := json.Unmarshal([]byte(out), &v); err != nil || len(v.Policies) == 0 {
			t.Fatalf("sim --json: %v: %.300s", err, out)
		}
		return v.Policies[0].TTFT.Mean
	}
	base, mine := ttft(), ttft("--preset-file", "testdata/preset.yaml")
	if !(mine > base) {
		t.Errorf("mean TTFT %g ms on the preset file (prefill 120us a token), want more than the base's %g ms (46us)", mine, base)
	}
	if _, _, err := runSimArgs(t, append(append([]string{}, args...), "--preset-file", "testdata/serve-settings.golden")...); err == nil {
		t.Error("--preset-file of a non-YAML file: no error")
	}
}

// TestFitPrefillThroughOrigin: prefill times whose straight line would
// start below zero (a noisy engine) are fitted through the origin, not
// refused.
func TestFitPrefillThroughOrigin(t *testing.T) {
	f, err := fitPrefill([]float64{100, 200, 400, 800}, []float64{10, 26, 50, 100})
	if err != nil {
		t.Fatal(err)
	}
	if f[0] != 0 || f[2] != 0 || f[1] < 0.12 || f[1] > 0.13 {
		t.Errorf("fit %v, want 0 + 0.125·x", f)
	}
}

package fleet

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
)

// TestRatesConvergeOnSlowerFleet: a fleet whose engines are twice as slow
// as the preset in every timing figure, routed by kv-aware from the
// preset's rates, learns both corrections within 400 requests (about 100
// a replica): each replica's DecodeScale (from inter-token latencies)
// ends within 15% of 2, and its Scale (from times to first token) too,
// over the fleet (geometric mean; each replica within 50%: the TTFT the
// policy predicts, which Scale corrects, is kv-aware's model, less exact
// than the decode one under queueing, and a replica's Scale weighs its
// last ten or so requests most). Over seeds 1..12 of this test each
// replica's Scale ended 1.01..1.45 times the truth (the same spread as
// when Scale was learned at the first token, against the predicted cache
// hit: 1.03..1.39), the fleet's 1.06..1.16 times.
func TestRatesConvergeOnSlowerFleet(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		scale, decode := convergeRun(t, []float64{2, 2, 2, 2}, 400, seed)
		checkScales(t, seed, scale, decode, 2)
	}
}

// TestRatesConvergeOnFasterFleet: the same for engines 20 times faster
// than the preset (an emulator at --time-scale 0.05 behind a router told
// nothing of it): both scales end near 0.05, inside the Calibrator's
// range of 1/1024..1024.
func TestRatesConvergeOnFasterFleet(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		scale, decode := convergeRun(t, []float64{0.05, 0.05, 0.05, 0.05}, 400, seed)
		checkScales(t, seed, scale, decode, 0.05)
	}
}

// TestRatesPoolBesideASlowReplica: a fleet of eight, one of them twice
// as slow as the preset in every timing figure (a degraded GPU, a noisy
// neighbour), the others as fast: the slow one learns its own DecodeScale
// (within 15% of 2), and the seven others still pool theirs, agreeing
// within 0.5% (0.03–0.07% in these seeds). Pooled with it, they spread
// as their own estimates do, 0.9–1.8% here: its distance read as the
// others' spread stops their pooling. On a decode of 12 s, 1% is 120 ms,
// more than most prefixes a request would reuse.
func TestRatesPoolBesideASlowReplica(t *testing.T) {
	factors := []float64{1, 1, 1, 1, 1, 1, 1, 2}
	for seed := uint64(1); seed <= 4; seed++ {
		_, decode := convergeRun(t, factors, 1600, seed)
		if d := decode[7]; math.Abs(d/2-1) > 0.15 {
			t.Errorf("seed %d: the slow replica's DecodeScale %.4f, want 2 ± 15%%", seed, d)
		}
		lo, hi := decode[0], decode[0]
		for _, d := range decode[:7] {
			lo, hi = min(lo, d), max(hi, d)
		}
		t.Logf("seed %d: DecodeScale %.4f", seed, decode)
		if hi/lo-1 > 0.005 {
			t.Errorf("seed %d: the equal replicas' DecodeScale spread %.2f%% (%.4f), want ≤ 0.5%%", seed, 100*(hi/lo-1), decode[:7])
		}
	}
}

func checkScales(t *testing.T, seed uint64, scale, decode []float64, want float64) {
	t.Helper()
	logMean := 0.0
	for i := range scale {
		t.Logf("seed %d, replica %d: Scale %.4f, DecodeScale %.4f (want %g)", seed, i, scale[i], decode[i], want)
		logMean += math.Log(scale[i]) / float64(len(scale))
		if math.Abs(scale[i]/want-1) > 0.5 {
			t.Errorf("seed %d, replica %d: Scale %.4f, want %g ± 50%%", seed, i, scale[i], want)
		}
		if math.Abs(decode[i]/want-1) > 0.15 {
			t.Errorf("seed %d, replica %d: DecodeScale %.4f, want %g ± 15%%", seed, i, decode[i], want)
		}
	}
	if mean := math.Exp(logMean); math.Abs(mean/want-1) > 0.15 {
		t.Errorf("seed %d: the fleet's Scale (geometric mean) %.4f, want %g ± 15%%", seed, mean, want)
	}
}

// convergeRun drives a fleet of engine models, one per factor, whose
// timing figures are factor times the llama3-8b-h100 preset's, with
// requests requests, as the simulator does on one virtual clock
// (arrivals, engine steps, scrapes every 100 ms), the fleet starting from
// the preset's rates, and returns each replica's Scale and DecodeScale at
// the end (seed draws the workload). The load is moderate:
// a request every 0.3 s of the preset's time per replica, prompts of 500
// to 3,000 tokens (a quarter share a 1,024-token prefix), 20 to 200
// output tokens; the arrivals and scrapes are stretched by the factors'
// mean with the engines.
func convergeRun(t *testing.T, factors []float64, requests int, seed uint64) (scale, decode []float64) {
	t.Helper()
	n := len(factors)
	rng := rand.New(rand.NewPCG(seed, 0))
	base, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	preset := base.Rates()
	ids := make([]string, n)
	engines := make([]*engine.Engine, n)
	mean := 0.0
	for i, factor := range factors {
		ecfg := base
		times := func(d *time.Duration) { *d = time.Duration(float64(*d) * factor) }
		for _, d := range []*time.Duration{&ecfg.StepOverhead, &ecfg.PrefillPerToken, &ecfg.AttnPerMPairs,
			&ecfg.DecodeStep, &ecfg.DecodePerSeq, &ecfg.DecodePerMTokens} {
			times(d)
		}
		ecfg.NoTokenEvents = true
		ids[i] = fmt.Sprintf("r%d", i)
		if engines[i], err = engine.New(ecfg); err != nil {
			t.Fatal(err)
		}
		mean += factor / float64(n)
	}
	f := newFleet(t, Config{Replicas: reps(ids...), Policy: route.KVAware{}, Rates: preset})
	gap := time.Duration(float64(300*time.Millisecond) / float64(n) * mean)
	run := newEngineRun(t, f, ids, engines, time.Duration(float64(100*time.Millisecond)*mean))
	var sc Scratch
	nextArrival, sent := time.Duration(0), 0
	shared := make([]prefix.Hash, 64) // 1,024 tokens
	for k := range shared {
		shared[k] = prefix.Hash(1000 + k)
	}
	for run.done < requests {
		if !run.advance(nextArrival, sent < requests) {
			continue
		}
		prompt, output := 500+rng.IntN(2500), 20+rng.IntN(180)
		hashes := make([]prefix.Hash, prompt/16)
		for k := range hashes {
			hashes[k] = prefix.Hash(uint64(sent+1)<<20 | uint64(k))
		}
		if rng.IntN(4) == 0 {
			copy(hashes, shared)
		}
		id := fmt.Sprint("q", sent)
		run.send(&Request{ID: id, Hash: uint64(sent) * 0x9e3779b97f4a7c15, Tokens: prompt, MaxTokens: output,
			Chains: []residency.Chain{{Tokens: 16, Hashes: hashes}}, TTFT: true},
			&engine.Request{ID: id, Prompt: prompt, Hashes: hashes, MaxTokens: output}, &sc)
		sent++
		nextArrival += time.Duration(float64(gap) * (0.5 + rng.Float64()))
	}
	var s route.Snapshot
	f.Snapshot(&s, run.at(run.now), 0)
	for _, r := range s.Replicas {
		scale, decode = append(scale, r.Rates.Scale), append(decode, r.Rates.DecodeScale)
	}
	return scale, decode
}

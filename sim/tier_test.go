package sim

import (
	"testing"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/trace"
)

// TestKVAwareFollowsTheCPUTier: on document-qa, whose sessions' documents
// together are three times the fleet's GPU KV (LRU's worst case: each
// cycles through the GPU cache before it is asked for again) but fit in
// CPU tiers four times the GPU's, the engines load most prompts from
// their tier. kv-aware's predicted cached tokens track the engines' (its
// residency at TierHorizon, learned from the tier's own churn), within 2
// points of hit rate, and its placement follows them: its hit rate is at
// least 0.97× the best of the policies that keep a session where it was.
// The replicas have a quarter of the preset's GPU KV, so the workload
// (sized to it) is a quarter as long: the same proportions in a fifth of
// the time.
func TestKVAwareFollowsTheCPUTier(t *testing.T) {
	preset, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	preset.NumBlocks /= 4
	preset.CPUBlocks = 4 * preset.NumBlocks
	const replicas = 4
	w, err := trace.Generate("document-qa", trace.GenOptions{Seed: 1, FleetKVTokens: FleetKVTokens(preset, replicas)})
	if err != nil {
		t.Fatal(err)
	}
	o, err := simulate(Config{Requests: w.Requests, Replicas: replicas, Preset: preset, Load: 0.8,
		Policies: []string{"kv-aware", "sglang-cache-aware", "session-hash", "preble-e2"}})
	if err != nil {
		t.Fatal(err)
	}
	hit, predicted := hitRates(o.runs[0])
	best := 0.0
	for _, r := range o.runs[1:] {
		h, _ := hitRates(r)
		best = max(best, h)
	}
	t.Logf("kv-aware hit %.1f%%, predicted %.1f%%; best other %.1f%%; pooled oracle %.1f%%", 100*hit, 100*predicted, 100*best, 100*o.pooled.rate())
	if d := hit - predicted; d > 0.02 || d < -0.02 {
		t.Errorf("predicted hit rate %.1f%%, engines' %.1f%%: want within 2 points", 100*predicted, 100*hit)
	}
	if hit < 0.97*best {
		t.Errorf("hit rate %.1f%%, want at least 0.97 × the best other's %.1f%%", 100*hit, 100*best)
	}
}

// hitRates is a run's hit rate and predicted hit rate over its completed
// requests.
func hitRates(res *result) (hit, predicted float64) {
	var p, c, pc int64
	for _, s := range res.samples {
		if s.OK {
			p += int64(s.Prompt)
			c += int64(s.Cached)
			pc += int64(s.PredictedCached)
		}
	}
	if p == 0 {
		return 0, 0
	}
	return float64(c) / float64(p), float64(pc) / float64(p)
}

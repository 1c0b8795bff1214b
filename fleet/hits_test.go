package fleet

import (
	"math"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/route"
)

// TestScaleLearnsSpeedNotCacheMisses: a replica that computes exactly at
// the preset's speed, behind an index that predicts 4,000 of each 5,000
// prompt tokens cached where the engine has none. Scale, which corrects
// compute speed, stays 1: each observed TTFT is set against the prefill
// the engine did (its usage says it cached nothing), not the one
// predicted (learned against that, Scale would be the 5,000-token
// prefill over the 1,000-token one, some 6). The misprediction is
// HitScale's: the engines' cached tokens over the expected ones, which
// falls to its floor, and to 0.5 for a replica that caches half.
func TestScaleLearnsSpeedNotCacheMisses(t *testing.T) {
	for _, tc := range []struct {
		name            string
		cached          int
		wantScale, want float64
	}{
		{"none cached", 0, 1, minHitScale},
		{"half cached", 2000, 1, 0.5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, Config{Replicas: reps(a)})
			now := t0
			for range 40 {
				h := f.rates(t).HitScale
				c := Claim{PrefillTokens: 5000 - int(4000*h), Tokens: 5001, PredictedCached: int(4000 * h), PromptTokens: 5000,
					PredictedTTFT: f.preset.PrefillTime(5000-int(4000*h), int(4000*h)), HitScale: h, Streamed: true}
				tk, err := f.Acquire(a, c, now)
				if err != nil {
					t.Fatal(err)
				}
				now = now.Add(f.preset.PrefillTime(5000-tc.cached, tc.cached))
				tk.FirstToken(now)
				tk.Done(now, Usage{PromptTokens: 5000, CachedTokens: tc.cached, CompletionTokens: 1}, nil)
				now = now.Add(time.Second)
			}
			r := f.rates(t)
			if math.Abs(r.Scale/tc.wantScale-1) > 0.01 || math.Abs(r.HitScale/tc.want-1) > 0.01 {
				t.Errorf("Scale %.3f, HitScale %.3f; want %g, %g", r.Scale, r.HitScale, tc.wantScale, tc.want)
			}
		})
	}
}

// rates returns replica 0's rates as a snapshot shows them.
func (f *Fleet) rates(t *testing.T) route.Rates {
	t.Helper()
	var s route.Snapshot
	f.Snapshot(&s, t0, 16)
	return s.Replicas[0].Rates
}

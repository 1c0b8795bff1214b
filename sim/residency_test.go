package sim

import (
	"math"
	"testing"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/trace"
)

// TestResidencyCalibratedInOverload: in approximate mode kv-aware's
// estimate of what each replica still caches stays calibrated when the
// fleet is overloaded and its caches churn: with 8 × qwen3-32b-2xh100
// (the first 1,000 requests), at twice and three times the knee, its
// predicted cached tokens are within 3 points of the engines' (issue
// 40's bar). On multi-tenant-context, where most is reused, at 5f00867
// it predicted 50.6% where the engines held 73.7% at load 3; on
// document-qa, whose long documents churn the caches, it predicted 4.9%
// against 1.5% at load 2 until a match's age ran on by the queue's wait
// ahead of its prefill. minHit keeps the reuse each case measures.
func TestResidencyCalibratedInOverload(t *testing.T) {
	preset, err := engine.Preset("qwen3-32b-2xh100")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		workload string
		requests int
		minHit   float64
	}{
		{"multi-tenant-context", 1000, 0.5},
		{"document-qa", 2000, 0.005},
	} {
		w, err := trace.Generate(tc.workload, trace.GenOptions{Seed: 1, Requests: tc.requests})
		if err != nil {
			t.Fatal(err)
		}
		for _, load := range []float64{2, 3} {
			run, err := Run(Config{Workload: tc.workload, Requests: w.Requests, Replicas: 8, Load: load,
				Preset: preset, Policies: []string{"kv-aware"}})
			if err != nil {
				t.Fatal(err)
			}
			kv := resultOf(t, &run, "kv-aware")
			t.Logf("%s load %g: predicted %.1f%%, engines %.1f%%", tc.workload, load, 100*kv.PredictedHitRate, 100*kv.HitRate)
			if kv.HitRate < tc.minHit {
				t.Errorf("%s load %g: engines' hit rate %.1f%%: the workload no longer reuses what this test measures", tc.workload, load, 100*kv.HitRate)
			}
			if d := math.Abs(kv.PredictedHitRate - kv.HitRate); d > 0.03 {
				t.Errorf("%s load %g: predicted %.1f%% cached, engines %.1f%%: %.1f points apart, want within 3", tc.workload, load, 100*kv.PredictedHitRate, 100*kv.HitRate, 100*d)
			}
		}
	}
}

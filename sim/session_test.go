package sim

import (
	"slices"
	"testing"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/trace"
)

// TestKVAwareSessionsVersusSessionHash: on the session workloads kv-aware
// keeps a conversation where its history is cached unless the cost says
// otherwise, so it reuses about as much as pinning every session does
// (hit rate within 5 points of session-hash's) while finishing requests
// sooner (a lower mean and p99 end-to-end latency: it breaks a session
// when the conversation's replica is so busy that recomputing the history
// elsewhere costs the fleet less). Those breaks are what its TTFT tail
// pays: its TTFT p99 is above session-hash's here, a trade the objective
// (total latency) takes and this test does not hide (it logs both).
// Each figure is judged by its median over seeds 1-5: one run of 800
// requests moves the hit rate by a point or two either way, and a rule
// that holds for reasons holds on most seeds, not on one. On
// multi-turn-chat the SLO's miss term breaks more sessions whose replica
// is busy (median 3.5 points under session-hash's hit rate, with an
// end-to-end mean 10-30% lower); on agentic it keeps them (0.4 points).
func TestKVAwareSessionsVersusSessionHash(t *testing.T) {
	preset, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	const seeds = 5
	for _, name := range []string{"agentic", "multi-turn-chat"} {
		t.Run(name, func(t *testing.T) {
			var hit, mean, p99 [seeds]float64 // kv-aware's less session-hash's hit rate, its e2e mean and p99 over session-hash's
			for seed := range seeds {
				w, err := trace.Generate(name, trace.GenOptions{Seed: uint64(seed + 1), Requests: 800})
				if err != nil {
					t.Fatal(err)
				}
				run, err := Run(Config{Workload: name, Requests: w.Requests, Replicas: 8, Load: 0.8, Preset: preset,
					Policies: []string{"session-hash", "kv-aware"}})
				if err != nil {
					t.Fatal(err)
				}
				ms := func(m report.Millis) float64 { return float64(m) / 1e6 }
				sh, kv := resultOf(t, &run, "session-hash"), resultOf(t, &run, "kv-aware")
				t.Logf("seed %d: session-hash: hit %.3f, e2e mean %.0f p99 %.0f ms, ttft p99 %.0f ms; kv-aware: hit %.3f, e2e mean %.0f p99 %.0f ms, ttft p99 %.0f ms",
					seed+1, sh.HitRate, ms(sh.E2E.Mean), ms(sh.E2E.P99), ms(sh.TTFT.P99), kv.HitRate, ms(kv.E2E.Mean), ms(kv.E2E.P99), ms(kv.TTFT.P99))
				hit[seed], mean[seed], p99[seed] = kv.HitRate-sh.HitRate, ms(kv.E2E.Mean)/ms(sh.E2E.Mean), ms(kv.E2E.P99)/ms(sh.E2E.P99)
			}
			median := func(x [seeds]float64) float64 { slices.Sort(x[:]); return x[seeds/2] }
			if d := median(hit); d < -0.05 {
				t.Errorf("hit rate %+.3f against session-hash's, median over seeds %v: want within 5 points", d, hit)
			}
			if m, p := median(mean), median(p99); m > 1 || p > 1 {
				t.Errorf("end-to-end mean %.3f and p99 %.3f of session-hash's, medians over seeds %v %v: want no worse", m, p, mean, p99)
			}
		})
	}
}

// resultOf returns the named policy's figures in run.
func resultOf(t *testing.T, run *report.Run, policy string) *report.Result {
	t.Helper()
	for i := range run.Policies {
		if run.Policies[i].Policy == policy {
			return &run.Policies[i]
		}
	}
	t.Fatalf("no result for %s", policy)
	return nil
}

package sim

import (
	"testing"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/trace"
)

// TestKVAwareSessionsVersusSessionHash: on the session workloads kv-aware
// keeps a conversation where its history is cached unless the cost says
// otherwise, so it reuses about as much as pinning every session does
// (hit rate within 3 points of session-hash's) while finishing requests
// sooner (a lower mean and p99 end-to-end latency: it breaks a session
// when the conversation's replica is so busy that recomputing the history
// elsewhere costs the fleet less). Those breaks are what its TTFT tail
// pays: its TTFT p99 is above session-hash's here, a trade the objective
// (total latency) takes and this test does not hide (it logs both).
func TestKVAwareSessionsVersusSessionHash(t *testing.T) {
	preset, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"agentic", "multi-turn-chat"} {
		t.Run(name, func(t *testing.T) {
			w, err := trace.Generate(name, trace.GenOptions{Seed: 1, Requests: 800})
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
			t.Logf("session-hash: hit %.3f, e2e mean %.0f p99 %.0f ms, ttft p99 %.0f ms; kv-aware: hit %.3f, e2e mean %.0f p99 %.0f ms, ttft p99 %.0f ms",
				sh.HitRate, ms(sh.E2E.Mean), ms(sh.E2E.P99), ms(sh.TTFT.P99), kv.HitRate, ms(kv.E2E.Mean), ms(kv.E2E.P99), ms(kv.TTFT.P99))
			if kv.HitRate < sh.HitRate-0.03 {
				t.Errorf("hit rate %.3f, session-hash %.3f: want within 3 points", kv.HitRate, sh.HitRate)
			}
			if kv.E2E.Mean > sh.E2E.Mean || kv.E2E.P99 > sh.E2E.P99 {
				t.Errorf("end-to-end mean %.0f p99 %.0f ms, session-hash %.0f %.0f ms: want no worse", ms(kv.E2E.Mean), ms(kv.E2E.P99), ms(sh.E2E.Mean), ms(sh.E2E.P99))
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

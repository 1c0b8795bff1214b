package loadgen

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/proxy"
	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/trace"
)

// testScale is the emulators' time scale in these tests: wall seconds per
// model second.
const testScale = 0.1

// startReplicas starts n emulated replicas on loopback for the test.
func startReplicas(t *testing.T, n int) []*emulator.Server {
	t.Helper()
	out := make([]*emulator.Server, n)
	for i := range out {
		s, err := emulator.Start(emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: testScale}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		out[i] = s
	}
	return out
}

// startRouter runs a kvrouter with policy in front of reps and returns
// the URLs of its API and of its admin surface (/metrics).
func startRouter(t *testing.T, policy string, reps []*emulator.Server) (api, admin string) {
	t.Helper()
	cfg := proxy.DefaultConfig()
	cfg.ClientHeaders = true // replicas are attributed by X-Kvrouter-Replica
	cfg.Policy = policy
	cfg.Listen = "127.0.0.1:0"
	for _, s := range reps {
		cfg.Backends = append(cfg.Backends, proxy.Backend{URL: s.URL()})
	}
	rt, err := proxy.New(cfg, proxy.Deps{Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	srv := httptest.NewServer(rt.Handler())
	adm := httptest.NewServer(rt.AdminHandler())
	t.Cleanup(func() {
		srv.Close()
		adm.Close()
		cancel()
		<-done
	})
	return srv.URL, adm.URL
}

// chats is a small conversational workload: sessions of turns, each turn
// the system prompt, the history and a new question, arriving 40 ms
// (model time) apart.
func chats(sessions, turns int) []trace.Request {
	var out []trace.Request
	id := uint64(100)
	sys := trace.Segment{ID: 1, Tokens: 600}
	for s := range sessions {
		segs := []trace.Segment{sys}
		for turn := range turns {
			id++
			segs = append(segs, trace.Segment{ID: id, Tokens: 300 + 50*turn})
			out = append(out, trace.Request{
				ID: fmt.Sprintf("s%d-t%d", s, turn), Session: fmt.Sprintf("s%d", s),
				At: time.Duration(len(out)) * 40 * time.Millisecond, Segments: append([]trace.Segment(nil), segs...),
				Output: 16,
			})
			id++
			segs = append(segs, trace.Segment{ID: id, Tokens: 16})
		}
	}
	return out
}

// TestReplayMatchesEngine replays a conversational workload against one
// replica directly and against two through the router, then checks the
// client's figures against what the engines report about themselves:
// cached tokens from the usage chunks must add up to the engines' own
// vllm:prefix_cache_hits_total, prompt tokens to their
// prefix_cache_queries_total, and the mean TTFT the client measured (wall
// time / time scale) must be the engines' mean
// vllm:time_to_first_token_seconds plus a little transport overhead.
func TestReplayMatchesEngine(t *testing.T) {
	for _, tc := range []struct {
		name     string
		replicas int
		router   bool
	}{
		{"direct", 1, false},
		{"router", 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reps := startReplicas(t, tc.replicas)
			target := reps[0].URL()
			if tc.router {
				target, _ = startRouter(t, "kv-aware", reps)
			}
			reqs := chats(4, 4)
			res, err := Run(context.Background(), Config{Target: target, Requests: reqs, TimeScale: testScale, Duration: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			tot := res.Totals()
			if tot.OK != len(reqs) {
				t.Fatalf("completed %d of %d requests; errors %v", tot.OK, len(reqs), tot.Errors)
			}
			var eng EngineFigures
			for _, s := range reps {
				f, err := ScrapeEngine(context.Background(), http.DefaultClient, s.URL())
				if err != nil {
					t.Fatal(err)
				}
				eng = eng.Add(f)
			}
			if got, want := float64(tot.CachedTokens), eng.PrefixHits; got != want {
				t.Errorf("usage cached tokens %v, engine prefix_cache_hits_total %v", got, want)
			}
			if got, want := float64(tot.PromptTokens), eng.PrefixQueries; got != want {
				t.Errorf("usage prompt tokens %v, engine prefix_cache_queries_total %v", got, want)
			}
			if tot.CachedTokens == 0 {
				t.Errorf("no cached tokens on a conversational workload")
			}
			if got, want := eng.TTFTCount, uint64(len(reqs)); got != want {
				t.Errorf("engine TTFT count %d, want %d", got, want)
			}
			var sum time.Duration
			for _, s := range res.Samples {
				sum += s.TTFT
				if tc.router && s.Replica == "" {
					t.Errorf("%s: no %s header through the router", s.ID, HeaderReplica)
				}
				if tc.router && (s.Reason == "" || s.PredictedCached < 0) {
					t.Errorf("%s: reason %q, predicted cached %d: no %s header through the router", s.ID, s.Reason, s.PredictedCached, HeaderDecision)
				}
				if !tc.router && (s.Reason != "" || s.PredictedCached != -1) {
					t.Errorf("%s: reason %q, predicted cached %d straight from an engine, want none and -1", s.ID, s.Reason, s.PredictedCached)
				}
			}
			// The report's decision reasons and predicted hit rate come
			// from those headers; straight from an engine there are none.
			rep := res.Summarize("x", nil, report.SLO{})
			decided := 0
			for _, n := range rep.Reasons {
				decided += n
			}
			if tc.router && (decided != len(reqs) || rep.NoPrediction || rep.PredictedHitRate <= 0) {
				t.Errorf("through the router: %d reasons %v for %d requests, no prediction %v, predicted hit rate %v; want every request's reason and a prediction",
					decided, rep.Reasons, len(reqs), rep.NoPrediction, rep.PredictedHitRate)
			}
			if !tc.router && (decided != 0 || !rep.NoPrediction) {
				t.Errorf("straight from an engine: reasons %v, no prediction %v; want none", rep.Reasons, rep.NoPrediction)
			}
			measured, engine := sum/time.Duration(len(res.Samples)), eng.MeanTTFT()
			// Transport overhead (HTTP, JSON, the emulator's tokenizer, the
			// router's hashing) is about 2-3 wall milliseconds per request,
			// i.e. tens of model milliseconds. Under -race the whole HTTP
			// path slows by one or two orders of magnitude, so only the
			// lower bound is checked there.
			slack := time.Duration(float64(5*time.Millisecond)/testScale) + engine/4
			t.Logf("mean TTFT measured %v, engine %v (model time); hit rate %.3f", measured, engine, tot.HitRate())
			if measured < engine*95/100 {
				t.Errorf("mean TTFT measured %v below the engine's own %v", measured, engine)
			}
			if !raceEnabled && measured > engine+slack {
				t.Errorf("mean TTFT measured %v, engine reports %v: want at most %v more", measured, engine, slack)
			}
			if math.IsNaN(tot.HitRate()) {
				t.Error("hit rate NaN")
			}
		})
	}
}

// routerTotals reads the router's /metrics and sums its predicted and
// actual cached tokens and its prompt tokens over the replicas.
func routerTotals(t *testing.T, url string) (predicted, actual, prompt float64) {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return counter(fams, "kvrouter_predicted_cached_tokens"), counter(fams, "kvrouter_actual_cached_tokens"), counter(fams, "kvrouter_prompt_tokens")
}

// TestTextModePredictsReplay drives the router in text mode with the
// replay's own request bodies (shared-prefix groups: a long shared context
// in the first message, a different question after it) on four emulated
// replicas: the router finds the shared context, so its predicted cached
// tokens are within 10% of what the engines served from cache, and its
// hit rate is well above round-robin's. Twelve groups, not six: on a
// starved machine two requests of a group can reach a busy engine within
// one iteration and the second misses the prefix the first is computing,
// a few thousand tokens the router predicted cached (CI saw 11% on six
// groups once); over twelve such a pair weighs half as much.
func TestTextModePredictsReplay(t *testing.T) {
	w, err := trace.Generate("shared-prefix", trace.GenOptions{Seed: 1, Groups: 12, PerGroup: 6})
	if err != nil {
		t.Fatal(err)
	}
	hit := map[string]float64{}
	for _, policy := range []string{"kv-aware", "round-robin"} {
		reps := startReplicas(t, 4)
		url, admin := startRouter(t, policy, reps)
		res, err := Run(context.Background(), Config{Target: url, Requests: w.Requests, TimeScale: testScale, Duration: 60 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if tot := res.Totals(); tot.OK != len(w.Requests) {
			t.Fatalf("%s: completed %d of %d requests; errors %v", policy, tot.OK, len(w.Requests), tot.Errors)
		}
		predicted, actual, prompt := routerTotals(t, admin)
		hit[policy] = actual / prompt
		t.Logf("%s: predicted %.0f, actual %.0f cached of %.0f prompt tokens", policy, predicted, actual, prompt)
		if policy == "kv-aware" && (actual == 0 || math.Abs(predicted-actual) > 0.1*actual) {
			t.Errorf("kv-aware predicted %.0f cached tokens, the engines served %.0f: want within 10%%", predicted, actual)
			// Each request's decision against what its engine served, to
			// tell a mis-priced residency from a prefix that was still
			// being computed when the next request of its group came.
			for _, s := range res.Samples {
				t.Logf("%s sent %v to %s: %s, predicted %d, cached %d of %d, TTFT %v", s.ID, s.Sent, s.Replica, s.Reason, s.PredictedCached, s.CachedTokens, s.PromptTokens, s.TTFT)
			}
		}
	}
	if hit["kv-aware"] < hit["round-robin"]+0.1 {
		t.Errorf("hit rate kv-aware %.3f, round-robin %.3f: want kv-aware at least 0.1 above", hit["kv-aware"], hit["round-robin"])
	}
}

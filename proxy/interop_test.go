package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/view"
)

// TestBlockSizes: with engines whose KV blocks are 32 or 64 tokens (not
// vLLM's default 16), the router learns each replica's block size (from
// its metrics, and in precise mode its events) and predicts the engine's
// cached tokens exactly, in approximate and precise mode (token mode:
// the engines' /tokenize).
func TestBlockSizes(t *testing.T) {
	for _, bs := range []int{32, 64} {
		for _, precise := range []bool{false, true} {
			t.Run(fmt.Sprintf("block=%d/precise=%v", bs, precise), func(t *testing.T) {
				cfg := emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: 0.01, BlockSize: bs}
				if precise {
					cfg.KVEventsEndpoint, cfg.ReplayEndpoint = "tcp://127.0.0.1:*", "tcp://127.0.0.1:*"
				}
				e, err := emulator.Start(cfg, "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { e.Close() })
				b := Backend{URL: e.URL()}
				if precise {
					b = eventBackend(e)
				}
				rt, url := preciseRouter(t, []Backend{b})
				wait.For(t, "the block size", func() bool { return rt.View(time.Now()).Replicas[0].BlockSize == bs })
				if precise {
					wait.For(t, "precise mode", func() bool { return rt.st.fleet.IndexMode(0) == IndexPrecise })
				}
				msgs := []chatMsg{{"system", words(1, 300)}, {"user", words(2, 100)}}
				for turn := range 3 {
					body := mustJSON(map[string]any{"model": "m", "messages": msgs, "max_tokens": 2})
					resp, out := do(t, "POST", url+"/v1/chat/completions", string(body), "X-Session-ID", "s")
					if resp.StatusCode != 200 {
						t.Fatalf("turn %d: status %d: %s", turn, resp.StatusCode, out)
					}
					if precise {
						settled(t, rt, 0, e)
					}
					msgs = append(msgs, chatMsg{"assistant", "ok"}, chatMsg{"user", words(3+turn, 50)})
				}
				for _, r := range rt.Decisions(3) {
					if r.ActualCached <= 0 && r.PredictedCached == 0 {
						continue // the first turn
					}
					if r.PredictedCached != r.ActualCached || r.ActualCached%bs != 0 {
						t.Errorf("record %s: predicted %d cached tokens, engine %d (blocks of %d)", r.ID, r.PredictedCached, r.ActualCached, bs)
					}
				}
				if r := rt.Decisions(1)[0]; r.ActualCached <= 0 {
					t.Errorf("last turn: engine cached %d tokens, want some", r.ActualCached)
				}
			})
		}
	}
}

// TestKVFullRetried: an engine that answers 500 when its KV cache cannot
// take a request (as llm-d-inference-sim does) has the request retried on
// another replica before the first byte, and the failures count for
// routing: the retries in /metrics, passive health, which soon takes the
// engine out of rotation, so that the sessions hashed to it stop going
// there first.
func TestKVFullRetried(t *testing.T) {
	full, err := emulator.Start(emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: 1, KVBlocks: 192, KVFullStatus: 500}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { full.Close() })
	// A long request, straight to the engine, holds most of its cache.
	hold, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() {
		req, _ := http.NewRequestWithContext(hold, "POST", full.URL()+"/v1/completions",
			strings.NewReader(`{"model":"m","max_tokens":600,"stream":true,"prompt":"`+words(99, 800)+`"}`))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			if resp.StatusCode != 200 {
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
				t.Errorf("held request: status %d: %s", resp.StatusCode, b)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
	wait.For(t, "the held request running", func() bool { return full.Stats().Running == 1 })
	ok := replicas(t, 1, 0.01)[0]
	rt, url := startRouter(t, "session-hash", func(c *Config) { c.HealthInterval = time.Minute }, full.URL(), ok.URL())
	runRouter(t, rt)
	retried := 0
	for s := range 20 {
		for turn := range 2 {
			body := fmt.Sprintf(`{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"%d %s"}]}`, s, words(s*10+turn, 400))
			resp, out := do(t, "POST", url+"/v1/chat/completions", body, "X-Session-ID", fmt.Sprint("s", s))
			if resp.StatusCode != 200 || resp.Header.Get(HeaderReplica) != ok.URL() {
				t.Fatalf("session %d turn %d: status %d from %s: %s; want 200 from %s", s, turn, resp.StatusCode, resp.Header.Get(HeaderReplica), out, ok.URL())
			}
			if rec := rt.Decisions(1)[0]; len(rec.Failed) == 1 && rec.Failed[0] == full.URL() {
				retried++
			}
		}
	}
	if retried == 0 {
		t.Fatal("no request was first sent to the full engine: the test proves nothing")
	}
	if got := metricValue(t, url, "kvrouter_retries_total", "replica", full.URL()); got != float64(retried) {
		t.Errorf("kvrouter_retries_total{replica=full} = %v, want %d", got, retried)
	}
	if full.Rejected() != int64(retried) {
		t.Errorf("the full engine rejected %d requests, the router retried %d", full.Rejected(), retried)
	}
	if r := rt.View(time.Now()).Replicas[0]; r.Healthy {
		t.Errorf("the full engine is still in rotation after %d failures", retried)
	}
	if retried > 8 {
		t.Errorf("%d requests went to the full engine first: passive health should take it out after 5", retried)
	}
}

// TestKVEventsBindIgnoredSaysSo: --kv-events-bind with a policy that reads
// no residency index is not silently dropped: the router says so at start.
func TestKVEventsBindIgnoredSaysSo(t *testing.T) {
	var buf bytes.Buffer
	cfg := DefaultConfig()
	cfg.ClientHeaders = true // the test reads the routing headers
	cfg.Policy = "round-robin"
	cfg.Backends = []Backend{{URL: "http://127.0.0.1:1"}}
	cfg.KVEventsBind = "tcp://127.0.0.1:0"
	cfg.Tokenizer = Remote
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if _, err := New(cfg, Deps{Registry: prometheus.NewRegistry(), Logger: log}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "reads no residency index: not following them") {
		t.Errorf("start log %q does not say the KV events are not followed", buf.String())
	}
}

// TestPredictedHitRateAtMostOne: in text mode the router's prompt-token
// estimate differs from the engine's count; the predicted hit rate the
// view reports is the predicted share of the router's estimate, counted in
// the engine's tokens, so it never exceeds 1.
func TestPredictedHitRateAtMostOne(t *testing.T) {
	reps := replicas(t, 1, 0.01)
	rt, url := startRouter(t, "kv-aware", nil, urls(reps)...)
	runRouter(t, rt)
	// Long words: the router estimates 4 characters a token, the emulator
	// counts words of up to 4 characters; spaces make the estimate high.
	text := strings.Repeat("ab ", 2000)
	for range 5 {
		resp, out := do(t, "POST", url+"/v1/completions", `{"model":"m","max_tokens":1,"prompt":"`+text+`"}`)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, out)
		}
	}
	r := rt.View(time.Now()).Replicas[0]
	if r.PromptTokens == 0 || r.PredictedCached > r.PromptTokens || r.PredictedCached == 0 {
		t.Errorf("predicted %d of %d prompt tokens cached; want some, at most all", r.PredictedCached, r.PromptTokens)
	}
	var est, eng int
	for _, d := range rt.Decisions(5) {
		est, eng = d.Tokens, d.PromptTokens
		if d.Outcome != view.OutcomeOK {
			t.Errorf("record %s: %s", d.ID, d.Outcome)
		}
	}
	t.Logf("router estimate %d tokens, engine %d", est, eng)
}

// TestNoHealthRoute: a backend with no /health route (many
// OpenAI-compatible servers) stays in rotation, probed at its
// /v1/models: the emulator serves both, so the router is pointed at a
// path it does not serve.
func TestNoHealthRoute(t *testing.T) {
	reps := replicas(t, 1, 0.01)
	rt, url := startRouter(t, "kv-aware", func(c *Config) {
		c.HealthPath = "/no-such-route"
		c.HealthInterval = 20 * time.Millisecond
	}, urls(reps)...)
	runRouter(t, rt)
	time.Sleep(200 * time.Millisecond) // staying in rotation through ten probe periods is the behaviour under test
	if !rt.View(time.Now()).Replicas[0].Healthy {
		t.Fatal("a replica without the probed route was taken out of rotation")
	}
	if resp, out := do(t, "POST", url+"/v1/completions", `{"model":"m","max_tokens":1,"prompt":"hi"}`); resp.StatusCode != 200 {
		t.Errorf("status %d: %s", resp.StatusCode, out)
	}
	if st, ok := rt.st.health.Status(reps[0].URL()); !ok || !strings.HasSuffix(st.Probe, "/v1/models") {
		t.Errorf("health status %+v, want probing /v1/models", st)
	}
}

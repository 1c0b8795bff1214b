package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/view"
	"net/http"
	"strings"
	"testing"
	"time"
)

// replicas starts n emulated replicas on loopback, fast (timeScale wall
// seconds per engine second).
func replicas(t *testing.T, n int, timeScale float64) []*emulator.Server {
	t.Helper()
	out := make([]*emulator.Server, n)
	for i := range out {
		s, err := emulator.Start(emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: timeScale}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		out[i] = s
	}
	return out
}

func urls(ss []*emulator.Server) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.URL()
	}
	return out
}

// runRouter starts the router's loops for the test's life.
func runRouter(t *testing.T, rt *Router) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

type chatMsg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatResp struct {
	Choices []struct {
		Message chatMsg `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// words returns deterministic text of n words, distinct per seed.
func words(seed, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "w%d_%d ", seed, (i*7919+seed)%1000)
	}
	return b.String()
}

// converse runs one multi-turn conversation and returns the replicas that
// served each turn and the cached / prompt tokens of turns after the first.
func converse(t *testing.T, url string, turns, seed int) (served []string, cached, prompt int) {
	msgs := []chatMsg{{"system", "You are terse. " + words(seed, 20)}}
	for turn := range turns {
		msgs = append(msgs, chatMsg{"user", words(seed*100+turn, 120)})
		b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "max_tokens": 8})
		resp, body := do(t, "POST", url+"/v1/chat/completions", string(b))
		if resp.StatusCode != 200 {
			t.Fatalf("turn %d: status %d: %s", turn, resp.StatusCode, body)
		}
		var r chatResp
		if err := json.Unmarshal([]byte(body), &r); err != nil || len(r.Choices) == 0 {
			t.Fatalf("turn %d: %v: %s", turn, err, body)
		}
		served = append(served, resp.Header.Get(HeaderReplica))
		if turn > 0 {
			cached += r.Usage.PromptTokensDetails.CachedTokens
			prompt += r.Usage.PromptTokens
		}
		msgs = append(msgs, r.Choices[0].Message)
	}
	return served, cached, prompt
}

func TestConversationStaysUnderKVAware(t *testing.T) {
	reps := replicas(t, 4, 0.01)
	hit := map[string]float64{}
	for _, policy := range []string{"kv-aware", "round-robin"} {
		for _, s := range reps {
			s.Reset()
		}
		rt, url := startRouter(t, policy, nil, urls(reps)...)
		runRouter(t, rt)
		served, cached, prompt := converse(t, url, 8, 1)
		distinct := map[string]bool{}
		for _, s := range served {
			distinct[s] = true
		}
		hit[policy] = float64(cached) / float64(prompt)
		t.Logf("%s: %d replicas, cached %d of %d prompt tokens (%.2f)", policy, len(distinct), cached, prompt, hit[policy])
		switch policy {
		case "kv-aware":
			if len(distinct) != 1 {
				t.Errorf("kv-aware: conversation served by %d replicas %v, want 1", len(distinct), served)
			}
			if hit[policy] < 0.7 {
				t.Errorf("kv-aware: hit rate %.2f, want >= 0.7", hit[policy])
			}
		case "round-robin":
			if len(distinct) != len(reps) {
				t.Errorf("round-robin: conversation served by %d replicas, want %d", len(distinct), len(reps))
			}
		}
	}
	if hit["kv-aware"] < hit["round-robin"]+0.3 {
		t.Errorf("kv-aware hit rate %.2f not clearly above round-robin's %.2f", hit["kv-aware"], hit["round-robin"])
	}
}

// TestStreamUsageOnEmulator: a streaming client that did not ask for usage
// sees no usage at all (no usage chunk, no "usage": null on the others),
// whether it left stream_options out or set include_usage false, and the
// router still records cached tokens.
func TestStreamUsageOnEmulator(t *testing.T) {
	reps := replicas(t, 2, 0.01)
	rt, url := startRouter(t, "kv-aware", nil, urls(reps)...)
	runRouter(t, rt)
	req := `{"model":"m","stream":true,"max_tokens":5,"messages":[{"role":"system","content":"` + words(3, 200) + `"},{"role":"user","content":"hi"}]}`
	for i, opts := range []string{"", `"stream_options":{"include_usage":false},`} {
		resp, body := do(t, "POST", url+"/v1/chat/completions", "{"+opts+req[1:])
		if resp.StatusCode != 200 || resp.Header.Get(HeaderReplica) == "" {
			t.Fatalf("status %d replica %q: %s", resp.StatusCode, resp.Header.Get(HeaderReplica), body)
		}
		if strings.Contains(body, `"usage"`) || strings.Count(body, "data: {") < 2 {
			t.Errorf("request %d: client got usage it did not ask for, or no chunks: %q", i, body)
		}
		if !strings.HasSuffix(body, "data: [DONE]\n\n") {
			t.Errorf("request %d: stream does not end with [DONE]: %q", i, body[max(0, len(body)-80):])
		}
	}
	recs := rt.Decisions(2) // newest first
	if len(recs) != 2 || recs[0].PromptTokens <= 0 || recs[0].ActualCached <= 0 {
		t.Fatalf("got records %+v, want actual cached tokens on the second request", recs)
	}
	if recs[0].Replica != recs[1].Replica {
		t.Errorf("repeat went to %s, first to %s", recs[0].Replica, recs[1].Replica)
	}
	if recs[0].PredictedCached <= 0 {
		t.Errorf("predicted cached %d, want > 0 on a repeat", recs[0].PredictedCached)
	}
}

func TestKilledReplicaGetsNoTraffic(t *testing.T) {
	reps := replicas(t, 3, 0.01)
	rt, url := startRouter(t, "round-robin", func(c *Config) { c.HealthInterval = 20 * time.Millisecond }, urls(reps)...)
	runRouter(t, rt)
	killed := reps[1].URL()
	reps[1].Close()
	served := map[string]int{}
	for i := range 12 {
		resp, body := do(t, "POST", url+"/v1/chat/completions", fmt.Sprintf(`{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"q%d"}]}`, i))
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, body)
		}
		served[resp.Header.Get(HeaderReplica)]++
	}
	if served[killed] != 0 {
		t.Errorf("killed replica served %d requests", served[killed])
	}
	if len(served) != 2 {
		t.Errorf("served by %v, want the two live replicas", served)
	}
	wait.Within(t, 2*time.Second, "the killed replica unhealthy (20 ms probes)", func() bool { return !rt.st.healthy(1) })
}

func TestClientDisconnectCancelsUpstream(t *testing.T) {
	reps := replicas(t, 1, 0.05)
	rt, url := startRouter(t, "kv-aware", nil, urls(reps)...)
	runRouter(t, rt)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"max_tokens":4000,"messages":[{"role":"user","content":"tell me a long story"}]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if recs := rt.Decisions(1); len(recs) != 1 || recs[0].Outcome != view.OutcomeInFlight {
		t.Errorf("while streaming: got records %+v, want one in-flight", recs)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q: %v", line, err)
	}
	if got := reps[0].Stats().Running; got != 1 {
		t.Fatalf("replica running %d while streaming, want 1", got)
	}
	cancel()
	resp.Body.Close()
	wait.For(t, "the replica and the router to end the request", func() bool {
		return reps[0].Stats().Running == 0 && inflight(rt, 0) == 0 && rt.Decisions(1)[0].Outcome != view.OutcomeInFlight
	})
	if c := reps[0].Stats().Canceled; c != 1 {
		t.Errorf("replica canceled %d requests, want 1", c)
	}
	recs := rt.Decisions(1)
	if len(recs) != 1 || recs[0].Outcome != "canceled" {
		t.Errorf("got records %+v, want one canceled", recs)
	}
}

// inflight is the router's in-flight count on replica i.
func inflight(rt *Router, i int) int {
	var s route.Snapshot
	rt.st.fleet.Snapshot(&s, time.Now(), 0)
	return s.Replicas[i].InFlight
}

// TestViewCapacityAndCalibration: the index share of each replica follows
// the capacity its engine reports (cache_config_info), streamed requests
// calibrate the replica's rates against observed TTFTs and inter-token
// latencies (the emulator runs 100× faster than its preset, so both scales
// fall below 1), and the view carries predicted and actual cached tokens.
func TestViewCapacityAndCalibration(t *testing.T) {
	s, err := emulator.Start(emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: 0.01, KVBlocks: 512}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	rt, url := startRouter(t, "kv-aware", func(c *Config) { c.ScrapeInterval = 10 * time.Millisecond }, s.URL())
	runRouter(t, rt)
	// 512 engine blocks of 16 tokens = 8192 tokens = 512 blocks of 16
	// estimated tokens (64-character chunks).
	const wantCap = 512
	wait.For(t, "the index capacity of the engine's cache_config_info", func() bool {
		return rt.View(time.Now()).Replicas[0].IndexCapacity == wantCap
	})
	// Long new questions after a shared system prompt: the preset predicts
	// hundreds of milliseconds of prefill, the engine takes a hundredth of
	// it, and the HTTP path's few milliseconds (tens under -race on a busy
	// machine) cannot hide the difference.
	for i := range 6 {
		req := `{"model":"m","stream":true,"max_tokens":30,"messages":[{"role":"system","content":"` + words(5, 600) +
			`"},{"role":"user","content":"` + words(100+i, 1500) + `"}]}`
		if resp, body := do(t, "POST", url+"/v1/chat/completions", req, "X-Session-ID", "one"); resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, body)
		}
	}
	v := rt.View(time.Now())
	r := v.Replicas[0]
	t.Logf("view: %+v", v)
	if v.Policy != "kv-aware" || v.Index != "approximate" || v.Decisions != 6 || v.Sessions != 1 {
		t.Errorf("view: policy %q index %q decisions %d sessions %d; want kv-aware approximate 6 1", v.Policy, v.Index, v.Decisions, v.Sessions)
	}
	if r.ID != s.URL() || !r.Healthy || r.InFlight != 0 || r.Completed != 6 {
		t.Errorf("replica: id %s healthy %v in flight %d completed %d", r.ID, r.Healthy, r.InFlight, r.Completed)
	}
	if r.IndexBlocks <= 0 || r.IndexBlocks > wantCap {
		t.Errorf("index blocks %d, want 1..%d", r.IndexBlocks, wantCap)
	}
	if r.PredictedCached <= 0 || r.ActualCached <= 0 {
		t.Errorf("predicted %d actual %d cached tokens, want both > 0", r.PredictedCached, r.ActualCached)
	}
	if r.Scale >= 1 || r.DecodeScale >= 1 {
		t.Errorf("calibration scales %.3f and %.3f (decode), want < 1 for an engine faster than its preset", r.Scale, r.DecodeScale)
	}
	if rec := rt.Decisions(1)[0]; rec.PredictedTTFTMS <= 0 {
		t.Errorf("record predicted TTFT %.3f ms, want > 0", rec.PredictedTTFTMS)
	}
}

// TestSessionRebindsWhenReplicaDies: a session stays on its replica; when
// that replica dies and health takes it out, the session's next request
// is routed afresh and the session is bound to the new replica.
func TestSessionRebindsWhenReplicaDies(t *testing.T) {
	reps := replicas(t, 2, 0.01)
	rt, url := startRouter(t, "kv-aware", func(c *Config) { c.HealthInterval = 20 * time.Millisecond }, urls(reps)...)
	runRouter(t, rt)
	msgs := []chatMsg{{"system", words(99, 60)}}
	send := func(turn int) string {
		msgs = append(msgs, chatMsg{"user", fmt.Sprintf("turn %d %s", turn, words(turn, 30))})
		body, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 2, "messages": msgs})
		resp, out := do(t, "POST", url+"/v1/chat/completions", string(body), "X-Session-ID", "s-1")
		if resp.StatusCode != 200 {
			t.Fatalf("turn %d: status %d: %s", turn, resp.StatusCode, out)
		}
		msgs = append(msgs, chatMsg{"assistant", "ok"})
		return resp.Header.Get(HeaderReplica)
	}
	first := send(0)
	if got := send(1); got != first {
		t.Fatalf("turn 1 went to %s, turn 0 to %s; want the bound replica", got, first)
	}
	dead := 0
	if reps[1].URL() == first {
		dead = 1
	}
	reps[dead].Close()
	wait.Within(t, 2*time.Second, "the dead replica unhealthy", func() bool { return !rt.st.healthy(dead) })
	second := send(2)
	if second == first {
		t.Fatalf("turn 2 went to the dead replica %s", first)
	}
	if rec := rt.Decisions(1)[0]; len(rec.Failed) != 0 || rec.Session != shownID(rt.sf.idKey, "s-1") || rec.SessionSource != SessionFromHeader {
		t.Errorf("turn 2 record: failed %v session %q from %q; want no retry, s-1 from header", rec.Failed, rec.Session, rec.SessionSource)
	}
	if got := send(3); got != second {
		t.Errorf("turn 3 went to %s, want %s, where the session was bound anew", got, second)
	}
}

package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/prefix"
)

// syncBuffer is a log sink safe for the router's goroutines and the
// test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// jsonLines parses every line of the log as one JSON object, failing
// the test on any that is not.
func jsonLines(t *testing.T, log string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for i, line := range strings.Split(strings.TrimSuffix(log, "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %d is not JSON: %v: %q", i+1, err, line)
		}
		for _, k := range []string{"time", "level", "msg"} {
			if _, ok := m[k]; !ok {
				t.Errorf("log line %d has no %q: %q", i+1, k, line)
			}
		}
		out = append(out, m)
	}
	return out
}

// decisionField reads one field of an X-Kvrouter-Decision value.
func decisionField(h, key string) string {
	for f := range strings.SplitSeq(h, "; ") {
		if k, v, ok := strings.Cut(f, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// sent is one request of the access-log test and what its client saw.
type sent struct {
	name, method, path, body string
	status                   int
	decision, replica        string
	prompt, cached           int // usage from the answer; -1: none
}

// TestAccessLogJSON runs a router with a JSON log on two emulated
// engines, sends routed requests (chat and completions, streamed and
// not), router-answered errors and a pass-through, and checks that every
// log line parses as JSON and that each request has exactly one access
// line at info whose fields agree with what the client saw: request id,
// replica and reason as the response headers say, status, model, the
// engine's prompt and cached tokens, a TTFT for streams within the
// duration.
func TestAccessLogJSON(t *testing.T) {
	reps := replicas(t, 2, 0.01)
	var logBuf syncBuffer
	log := slog.New(slog.NewJSONHandler(&logBuf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := DefaultConfig()
	cfg.ClientHeaders = true // the test reads the routing headers
	cfg.Listen = "127.0.0.1:0"
	for _, u := range urls(reps) {
		cfg.Backends = append(cfg.Backends, Backend{URL: u})
	}
	rt, err := New(cfg, Deps{Registry: prometheus.NewRegistry(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	runRouter(t, rt)
	srv := httptest.NewServer(rt.Handler())
	t.Cleanup(srv.Close)

	long := words(7, 300)
	chat := `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"` + long + `"}]}`
	reqs := []*sent{
		{name: "chat", method: "POST", path: "/v1/chat/completions", body: chat, status: 200},
		{name: "chat again (cached)", method: "POST", path: "/v1/chat/completions", body: chat, status: 200},
		{name: "chat stream", method: "POST", path: "/v1/chat/completions", status: 200,
			body: `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":6,"messages":[{"role":"user","content":"` + words(8, 50) + `"}]}`},
		{name: "completion", method: "POST", path: "/v1/completions", body: `{"model":"m","max_tokens":4,"prompt":"` + words(9, 40) + `"}`, status: 200},
		{name: "bad json", method: "POST", path: "/v1/chat/completions", body: `{"model":`, status: 400},
		{name: "unknown model", method: "POST", path: "/v1/chat/completions", body: `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, status: 404},
		{name: "pass-through", method: "POST", path: "/tokenize", body: `{"model":"m","prompt":"hello there"}`, status: 200},
		{name: "pass-through again", method: "POST", path: "/tokenize", body: `{"model":"m","prompt":"hello again"}`, status: 200},
	}
	for _, s := range reqs {
		req, _ := http.NewRequest(s.method, srv.URL+s.path, strings.NewReader(s.body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != s.status {
			t.Fatalf("%s: status %d, want %d: %s", s.name, resp.StatusCode, s.status, b)
		}
		s.decision, s.replica = resp.Header.Get(HeaderDecision), resp.Header.Get(HeaderReplica)
		s.prompt, s.cached = usageOf(t, b)
	}

	if reqs[1].cached <= 0 {
		t.Errorf("the repeated chat had %d cached tokens, want some (the test compares real cache hits)", reqs[1].cached)
	}
	var access []map[string]any
	wait.For(t, "an access line per request", func() bool {
		access = access[:0]
		for _, m := range jsonLines(t, logBuf.String()) {
			if m["msg"] == "request" {
				access = append(access, m)
			}
		}
		return len(access) >= len(reqs)
	})
	if len(access) != len(reqs) {
		t.Fatalf("got %d access lines, want %d:\n%s", len(access), len(reqs), logBuf.String())
	}
	ids := map[string]string{}
	for i, s := range reqs {
		m := access[i] // the requests were sequential: their lines are in order
		t.Run(s.name, func(t *testing.T) { checkAccess(t, m, s) })
		if id, _ := m["id"].(string); id != "" {
			if other, dup := ids[id]; dup {
				t.Errorf("%s and %s both logged with id %q: want an id per request", other, s.name, id)
			}
			ids[id] = s.name
		} else if strings.HasPrefix(s.name, "pass-through") {
			t.Errorf("%s: logged without an id", s.name)
		}
	}
}

// checkAccess compares one access line with what the client saw.
func checkAccess(t *testing.T, m map[string]any, s *sent) {
	str := func(k string) string { v, _ := m[k].(string); return v }
	num := func(k string) (float64, bool) { v, ok := m[k].(float64); return v, ok }
	if str("level") != "INFO" || str("method") != s.method || str("path") != s.path {
		t.Errorf("level %q method %q path %q, want INFO %s %s", str("level"), str("method"), str("path"), s.method, s.path)
	}
	if st, _ := num("status"); int(st) != s.status {
		t.Errorf("status: got %v, want %d", m["status"], s.status)
	}
	if str("replica") != s.replica {
		t.Errorf("replica: got %q, want %q (the %s header)", str("replica"), s.replica, HeaderReplica)
	}
	d, _ := num("duration_ms")
	if d <= 0 {
		t.Errorf("duration_ms: got %v, want > 0", m["duration_ms"])
	}
	routed := s.decision != ""
	if routed {
		if id := decisionField(s.decision, "id"); str("id") != id || id == "" {
			t.Errorf("id: got %q, want %q (the decision header's)", str("id"), id)
		}
		if r := decisionField(s.decision, "reason"); str("reason") != r {
			t.Errorf("reason: got %q, want %q", str("reason"), r)
		}
		want, _ := strconv.Atoi(decisionField(s.decision, "predicted-cached"))
		if got, _ := num("predicted_cached_tokens"); int(got) != want {
			t.Errorf("predicted_cached_tokens: got %v, want %d", m["predicted_cached_tokens"], want)
		}
		if str("model") != "m" || str("outcome") != "ok" {
			t.Errorf("model %q outcome %q, want m ok", str("model"), str("outcome"))
		}
	}
	for k, want := range map[string]int{"prompt_tokens": s.prompt, "cached_tokens": s.cached} {
		got, ok := num(k)
		switch {
		case want < 0 && ok && routed:
			t.Errorf("%s: got %v, want it absent (not reported)", k, got)
		case want >= 0 && (!ok || int(got) != want):
			t.Errorf("%s: got %v, want %d (the answer's usage)", k, m[k], want)
		}
	}
	ttft, hasTTFT := num("ttft_ms")
	if strings.Contains(s.body, `"stream":true`) && (!hasTTFT || ttft <= 0 || ttft > d) {
		t.Errorf("ttft_ms: got %v, want within (0, duration %v]", m["ttft_ms"], d)
	}
	if s.status >= 400 && str("error") == "" {
		t.Errorf("error: none, want the error code of the %d", s.status)
	}
}

// usageOf reads prompt and cached tokens from a JSON answer or the usage
// chunk of a stream; -1 when absent.
func usageOf(t *testing.T, b []byte) (prompt, cached int) {
	prompt, cached = -1, -1
	for _, part := range strings.Split(string(b), "\n") {
		part = strings.TrimPrefix(part, "data: ")
		var u struct {
			Usage *struct {
				PromptTokens int `json:"prompt_tokens"`
				Details      *struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if json.Unmarshal([]byte(part), &u) != nil || u.Usage == nil {
			continue
		}
		prompt = u.Usage.PromptTokens
		if u.Usage.Details != nil {
			cached = u.Usage.Details.CachedTokens
		}
	}
	return prompt, cached
}

// BenchmarkAccessLog measures one access line of a routed request, as
// JSON to io.Discard: what the access log adds to each request at info.
//
//	go test -run='^$' -bench=AccessLog -benchmem ./proxy
func BenchmarkAccessLog(b *testing.B) {
	rt := &Router{log: slog.New(slog.NewJSONHandler(io.Discard, nil)), st: &state{}}
	be, err := newBackend(Backend{URL: "http://10.0.0.1:8000"})
	if err != nil {
		b.Fatal(err)
	}
	rt.st.bes.setLocked(0, be)
	t0 := time.Now()
	c := &call{rt: rt, bufs: newBufs(), id: "kvr-abc-1", method: "POST", path: "/v1/chat/completions", prompt: &prefix.Prompt{Model: "m", Stream: true},
		status: 200, outcome: "ok", replica: 0, routed: true, sessionSrc: SessionFromHeader, start: t0, end: t0.Add(40 * time.Millisecond),
		ttft: 12 * time.Millisecond, usage: fleet.Usage{PromptTokens: 1200, CachedTokens: 1024, CompletionTokens: 64}}
	c.dec.Reason, c.dec.Matched = "least-cost", 1024
	b.ReportAllocs()
	for b.Loop() {
		rt.logAccess(c)
	}
}

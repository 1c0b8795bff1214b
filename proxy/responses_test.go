package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/internal/wait"
)

const weatherTool = `{"type":"function","name":"get_weather","description":"Weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}`

// responseOf decodes the id and usage of a response object.
func responseOf(t *testing.T, body string) (id string, input, cached int) {
	t.Helper()
	var r struct {
		ID    string `json:"id"`
		Usage struct {
			InputTokens        int `json:"input_tokens"`
			InputTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"input_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil || r.ID == "" {
		t.Fatalf("not a response object (%v): %s", err, body)
	}
	return r.ID, r.Usage.InputTokens, r.Usage.InputTokensDetails.CachedTokens
}

// TestResponsesRouted: a Responses chain goes to the replica that holds
// each earlier response, its follow-up finds the earlier turn's prompt
// and output in that engine's cache (the engine's own count) as the
// router predicted, a chat request sharing the system prompt and tool
// schema is routed to it by prefix and reuses them, and a stream passes
// unchanged with its usage read from its last event.
func TestResponsesRouted(t *testing.T) {
	reps := replicas(t, 3, 0.01)
	rt, url := startRouter(t, "kv-aware", func(c *Config) { c.ScrapeInterval = 20 * time.Millisecond }, urls(reps)...)
	runRouter(t, rt)
	sys := words(1, 300)
	first := `{"model":"m","instructions":"` + sys + `","tools":[` + weatherTool + `],"input":"Weather in Paris?","max_output_tokens":8}`
	resp, body := do(t, "POST", url+"/v1/responses", first)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	id, input1, _ := responseOf(t, body)
	home := resp.Header.Get(HeaderReplica)
	prev := id
	for turn := range 3 {
		next := fmt.Sprintf(`{"model":"m","instructions":"%s","tools":[%s],"previous_response_id":%q,"input":[{"role":"user","content":"%s"}],"max_output_tokens":8}`, sys, weatherTool, prev, words(10+turn, 20))
		resp, body := do(t, "POST", url+"/v1/responses", next, "X-Session-ID", fmt.Sprintf("other-%d", turn))
		if resp.StatusCode != 200 {
			t.Fatalf("turn %d: status %d: %s", turn, resp.StatusCode, body)
		}
		if got := resp.Header.Get(HeaderReplica); got != home {
			t.Errorf("turn %d went to %s, want %s, which holds the previous response", turn, got, home)
		}
		var cached int
		prev, _, cached = responseOf(t, body)
		if turn == 0 && cached < input1-16 {
			t.Errorf("follow-up: engine cached %d tokens, want the first turn's %d but its last partial block", cached, input1)
		}
		rec := rt.Decisions(1)[0]
		if rec.ActualCached != cached || rec.PredictedCached < sysTokens(sys) {
			t.Errorf("turn %d: record actual %d predicted %d, want the engine's %d and at least the system prompt", turn, rec.ActualCached, rec.PredictedCached, cached)
		}
	}
	chat := `{"model":"m","tools":[{"type":"function","function":{"name":"get_weather","description":"Weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],"messages":[{"role":"system","content":"` + sys + `"},{"role":"user","content":"Weather in Oslo?"}],"max_tokens":4}`
	resp, body = do(t, "POST", url+"/v1/chat/completions", chat, "X-Session-ID", "a-chat")
	if resp.StatusCode != 200 || resp.Header.Get(HeaderReplica) != home {
		t.Fatalf("chat: status %d on %s, want 200 on %s: %s", resp.StatusCode, resp.Header.Get(HeaderReplica), home, body)
	}
	if rec := rt.Decisions(1)[0]; rec.ActualCached < sysTokens(sys) {
		t.Errorf("chat sharing the system prompt and tool schema: engine cached %d tokens, want at least %d", rec.ActualCached, sysTokens(sys))
	}

	// Instructions and tools do not carry over: the follow-up repeats them.
	stream := `{"model":"m","stream":true,"instructions":"` + sys + `","tools":[` + weatherTool + `],"previous_response_id":"` + prev + `","input":"more","max_output_tokens":4}`
	resp, body = do(t, "POST", url+"/v1/responses", stream)
	if resp.StatusCode != 200 || resp.Header.Get(HeaderReplica) != home {
		t.Fatalf("stream: status %d on %s: %s", resp.StatusCode, resp.Header.Get(HeaderReplica), body)
	}
	if !strings.Contains(body, "event: response.incomplete\n") || strings.Contains(body, `"error"`) && !strings.Contains(body, `"error":null`) {
		t.Errorf("stream changed on the way or cut: %q", body[max(0, len(body)-300):])
	}
	wait.For(t, "the stream's record", func() bool { return rt.Decisions(1)[0].PromptTokens > 0 })
	if rec := rt.Decisions(1)[0]; rec.Outcome != "ok" || rec.ActualCached < sysTokens(sys) || rec.PredictedCached < sysTokens(sys) {
		t.Errorf("stream record %+v, want ok with the engine's cached tokens", rec)
	}
}

// sysTokens is about the tokens of a system prompt of words (one token a
// word, less a block for the partial one).
func sysTokens(sys string) int { return len(strings.Fields(sys)) - 16 }

// TestResponsesErrors: a Responses request the router cannot route gets a
// clear error naming the field, and an unknown previous_response_id goes
// to a replica, whose own 404 comes back.
func TestResponsesErrors(t *testing.T) {
	reps := replicas(t, 1, 0.01)
	rt, url := startRouter(t, "kv-aware", nil, urls(reps)...)
	runRouter(t, rt)
	for _, tc := range []struct{ body, code string }{
		{`{"model":"m"}`, "missing_prompt"},
		{`{"input":"x"}`, "missing_model"},
		{`{"model":"m","input":5}`, "invalid_type"},
		{`{"model":"m","input":"x","max_output_tokens":-3}`, "integer_below_min_value"},
		{`{"model":"m","input":"x"`, "invalid_json"},
	} {
		resp, body := do(t, "POST", url+"/v1/responses", tc.body)
		if resp.StatusCode != 400 || !strings.Contains(body, `"code":"`+tc.code+`"`) {
			t.Errorf("%s: status %d %s, want 400 %s", tc.body, resp.StatusCode, body, tc.code)
		}
	}
	resp, body := do(t, "POST", url+"/v1/responses", `{"model":"m","previous_response_id":"resp_gone","input":"x"}`)
	if resp.StatusCode != 404 || !strings.Contains(body, "resp_gone") {
		t.Errorf("unknown previous response: status %d %s, want the engine's 404", resp.StatusCode, body)
	}
}

// TestPassThroughIDs: every pass-through request (embeddings here) reaches
// a replica and is logged with an id of its own.
func TestPassThroughIDs(t *testing.T) {
	reps := replicas(t, 2, 0.01)
	var logBuf syncBuffer
	log := slog.New(slog.NewJSONHandler(&logBuf, nil))
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	for _, u := range urls(reps) {
		cfg.Backends = append(cfg.Backends, Backend{URL: u})
	}
	rt, err := New(cfg, Deps{Registry: prometheus.NewRegistry(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(rt.Handler())
	t.Cleanup(srv.Close)
	runRouter(t, rt)
	for range 3 {
		resp, body := do(t, "POST", srv.URL+"/v1/embeddings", `{"model":"m","input":"hello"}`)
		if resp.StatusCode != 200 || !strings.Contains(body, `"embedding"`) {
			t.Fatalf("embeddings: status %d: %s", resp.StatusCode, body)
		}
	}
	ids := map[string]bool{}
	for _, m := range jsonLines(t, logBuf.String()) {
		if m["path"] == "/v1/embeddings" {
			ids[fmt.Sprint(m["id"])] = true
		}
	}
	if len(ids) != 3 {
		t.Errorf("3 pass-through requests logged with ids %v, want 3 distinct", ids)
	}
}

// TestResponsesPinned: under round-robin, which ignores prefixes and
// sessions, every follow-up still goes to the replica holding the
// response it continues, and a stored response's own path (GET
// /v1/responses/{id}) passes through to it.
func TestResponsesPinned(t *testing.T) {
	reps := replicas(t, 3, 0.01)
	rt, url := startRouter(t, "round-robin", nil, urls(reps)...)
	runRouter(t, rt)
	resp, body := do(t, "POST", url+"/v1/responses", `{"model":"m","input":"hi","max_output_tokens":2}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	home := resp.Header.Get(HeaderReplica)
	id, _, _ := responseOf(t, body)
	for turn := range 4 {
		resp, body := do(t, "POST", url+"/v1/responses", `{"model":"m","previous_response_id":"`+id+`","input":"more","max_output_tokens":2}`)
		if resp.StatusCode != 200 || resp.Header.Get(HeaderReplica) != home {
			t.Fatalf("turn %d: status %d on %s, want 200 on %s: %s", turn, resp.StatusCode, resp.Header.Get(HeaderReplica), home, body)
		}
		id, _, _ = responseOf(t, body)
	}
	if got := rt.passReplica(httptest.NewRequest("GET", "/v1/responses/"+id, nil)); rt.name(got) != home {
		t.Errorf("GET of the response goes to %s, want %s", rt.name(got), home)
	}
}

// FuzzRespCapture: any upstream bytes, cut anywhere, pass through
// unchanged, and what the capture keeps stays bounded and decodes or not
// without a panic.
func FuzzRespCapture(f *testing.F) {
	f.Add([]byte("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":3}}}\n\n"), true, 7)
	f.Add([]byte(`{"id":"r","output":[{"type":"message","content":[{"type":"output_text","text":"x"}]}],"usage":{"input_tokens":1}}`), false, 3)
	f.Fuzz(func(t *testing.T, in []byte, sse bool, cut int) {
		c := respCapture{body: io.NopCloser(&chunked{b: in, n: max(1, cut%64)}), sse: sse, ok: true}
		out, err := io.ReadAll(&c)
		if err != nil || !bytes.Equal(out, in) {
			t.Fatalf("passed %q (%v), want %q", out, err, in)
		}
		if len(c.buf) > maxCapture {
			t.Fatalf("kept %d bytes", len(c.buf))
		}
		c.result()
	})
}

// chunked reads b n bytes at a time.
type chunked struct {
	b []byte
	n int
}

func (r *chunked) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), r.n)], r.b)
	r.b = r.b[k:]
	return k, nil
}

// TestThreadsBounded: the threads kept stay within maxThreads and
// maxThreadBytes, the oldest dropped first.
func TestThreadsBounded(t *testing.T) {
	var ts threads
	for i := range maxThreads + 10 {
		ts.put(fmt.Sprint(i), &thread{replica: "r", bytes: 100})
	}
	if _, ok := ts.get("0"); ok || len(ts.byID) != maxThreads || len(ts.order) != maxThreads {
		t.Errorf("after %d puts: %d kept (%d in order), the first still there: %v; want %d, the first gone", maxThreads+10, len(ts.byID), len(ts.order), ok, maxThreads)
	}
	ts.put("big", &thread{replica: "r", bytes: maxThreadBytes - 1000})
	if ts.bytes > maxThreadBytes {
		t.Errorf("%d bytes kept, want at most %d", ts.bytes, maxThreadBytes)
	}
	if _, ok := ts.get("big"); !ok {
		t.Error("the newest thread was dropped")
	}
}

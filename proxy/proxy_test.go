package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/view"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeUpstream is a tiny OpenAI-compatible replica: it streams two chunks
// (and the usage chunk when asked), or answers JSON, and keeps the bodies it
// received.
type fakeUpstream struct {
	*httptest.Server
	status int // non-zero: answer every completion with this status

	mu     sync.Mutex
	bodies [][]byte
}

func newFake(t *testing.T, status int) *fakeUpstream {
	t.Helper()
	f := &fakeUpstream{status: status}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeUpstream) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/v1/models" {
		fmt.Fprintf(w, `{"object":"list","data":[{"id":"m","object":"model"},{"id":%q,"object":"model"}]}`, "only-"+f.URL[len(f.URL)-5:])
		return
	}
	if r.URL.Path == "/version" {
		fmt.Fprint(w, `{"version":"fake"}`)
		return
	}
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	f.mu.Unlock()
	if f.status != 0 {
		http.Error(w, `{"error":{"message":"busy"}}`, f.status)
		return
	}
	var req struct {
		Stream        bool
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	json.Unmarshal(body, &req)
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c","object":"chat.completion","choices":[{"message":{"role":"assistant","content":"Hi there"}}],"usage":{"prompt_tokens":100,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":48}}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	io.WriteString(w, chunk1)
	fl.Flush()
	io.WriteString(w, chunk2)
	fl.Flush()
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		io.WriteString(w, usageOnly)
	}
	io.WriteString(w, done)
}

func (f *fakeUpstream) received() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]byte(nil), f.bodies...)
}

// startRouter serves a Router in front of backends and returns it and its URL.
func startRouter(t *testing.T, policy string, mod func(*Config), backends ...string) (*Router, string) {
	t.Helper()
	rt := newTestRouter(t, policy, mod, backends...)
	// One test server carries both surfaces, as many tests read /metrics
	// or /ui next to the API (TestSurfacesApart: Handler alone serves
	// neither).
	mux := http.NewServeMux()
	mux.Handle("/", rt.Handler())
	admin := rt.AdminHandler()
	for _, p := range []string{"/metrics", "/ui/", "/debug/"} {
		mux.Handle(p, admin)
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return rt, srv.URL
}

// newTestRouter builds a Router with policy in front of backends, the
// default config otherwise but for ClientHeaders (tests read the routing
// headers), changed by mod when it is not nil.
func newTestRouter(t *testing.T, policy string, mod func(*Config), backends ...string) *Router {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Policy = policy
	cfg.ClientHeaders = true
	cfg.Listen = "127.0.0.1:0"
	for _, b := range backends {
		cfg.Backends = append(cfg.Backends, Backend{URL: b})
	}
	if mod != nil {
		mod(&cfg)
	}
	rt, err := New(cfg, Deps{Registry: prometheus.NewRegistry(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

func do(t *testing.T, method, url, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

const streamReq = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}`

func TestStreamStripsInjectedUsage(t *testing.T) {
	up := newFake(t, 0)
	rt, url := startRouter(t, "round-robin", nil, up.URL)
	resp, body := do(t, "POST", url+"/v1/chat/completions", streamReq)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if body != bare1+bare2+done {
		t.Errorf("client got %q, want the chunks without usage", body)
	}
	if got := resp.Header.Get(HeaderReplica); got != up.URL {
		t.Errorf("%s: got %q, want %q", HeaderReplica, got, up.URL)
	}
	if d := resp.Header.Get(HeaderDecision); !strings.Contains(d, "reason=round-robin") {
		t.Errorf("%s: got %q", HeaderDecision, d)
	}
	sent := up.received()
	if len(sent) != 1 || !bytes.Contains(sent[0], []byte(`"stream_options":{"include_usage":true}`)) {
		t.Errorf("upstream got %q, want include_usage injected", sent)
	}
	recs := rt.Decisions(10)
	if len(recs) != 1 || recs[0].ActualCached != 64 || recs[0].PromptTokens != 100 || recs[0].Outcome != "ok" {
		t.Errorf("got records %+v, want one ok with 64 cached of 100", recs)
	}
}

func TestBodyForwardedUnchanged(t *testing.T) {
	up := newFake(t, 0)
	_, url := startRouter(t, "round-robin", nil, up.URL)
	for _, req := range []string{
		`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m",  "messages":[{"role":"user","content":"héllo \u00e9"}], "user":"u1"}`,
		`{"model":"m","prompt":"once upon a time","max_tokens":5}`,
	} {
		resp, body := do(t, "POST", url+"/v1/chat/completions", req)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		got := up.received()
		if last := string(got[len(got)-1]); last != req {
			t.Errorf("upstream got %s, want %s", last, req)
		}
		if strings.Contains(req, "include_usage") && !strings.Contains(body, `"cached_tokens":64`) {
			t.Errorf("client asked for usage and got %q", body)
		}
	}
}

func TestBadInput(t *testing.T) {
	up := newFake(t, 0)
	_, url := startRouter(t, "round-robin", func(c *Config) { c.MaxBodyBytes = 1000 }, up.URL)
	tests := []struct {
		name, body string
		status     int
		code       string
	}{
		{"malformed json", `{"model":`, 400, "invalid_json"},
		{"not an object", `[1,2]`, 400, "invalid_json"},
		{"missing model", `{"messages":[{"role":"user","content":"x"}]}`, 400, "missing_model"},
		{"no prompt", `{"model":"m"}`, 400, "missing_prompt"},
		{"oversized", `{"model":"m","prompt":"` + strings.Repeat("x", 2000) + `"}`, 413, "request_too_large"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(t, "POST", url+"/v1/chat/completions", tc.body)
			if resp.StatusCode != tc.status {
				t.Errorf("status: got %d, want %d", resp.StatusCode, tc.status)
			}
			var e apiError
			if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("body %q is not an OpenAI error (%v)", body, err)
			}
			if e.Error.Code != tc.code {
				t.Errorf("code: got %v, want %s", e.Error.Code, tc.code)
			}
			// The router keeps serving.
			if resp, body := do(t, "POST", url+"/v1/chat/completions", streamReq); resp.StatusCode != 200 {
				t.Errorf("after bad input: status %d: %s", resp.StatusCode, body)
			}
		})
	}
	if n := len(up.received()); n != len(tests) {
		t.Errorf("upstream got %d requests, want %d (bad ones never forwarded)", n, len(tests))
	}
}

func TestRetryBeforeFirstByte(t *testing.T) {
	busy := newFake(t, http.StatusServiceUnavailable)
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close() // connection refused
	good := newFake(t, 0)
	rt, url := startRouter(t, "round-robin", nil, busy.URL, dead.URL, good.URL)
	for i := range 6 {
		resp, body := do(t, "POST", url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}]}`)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, body)
		}
		if got := resp.Header.Get(HeaderReplica); got != good.URL {
			t.Errorf("request %d: served by %s, want %s", i, got, good.URL)
		}
	}
	for _, rec := range rt.Decisions(6) {
		if rec.Replica != good.URL {
			t.Errorf("record %s: replica %s", rec.ID, rec.Replica)
		}
	}
}

func TestAllUpstreamsDown(t *testing.T) {
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	_, url := startRouter(t, "round-robin", nil, dead.URL)
	resp, body := do(t, "POST", url+"/v1/chat/completions", streamReq)
	if resp.StatusCode != http.StatusBadGateway && resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 502 or 503", resp.StatusCode)
	}
	var e apiError
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" {
		t.Fatalf("body %q is not an OpenAI error", body)
	}
}

func TestModelsUnionAndPassThrough(t *testing.T) {
	a, b := newFake(t, 0), newFake(t, 0)
	_, url := startRouter(t, "round-robin", nil, a.URL, b.URL)
	_, body := do(t, "GET", url+"/v1/models", "")
	var v struct {
		Data []struct{ ID string } `json:"data"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, m := range v.Data {
		ids[m.ID] = true
	}
	if len(v.Data) != 3 || !ids["m"] {
		t.Errorf("got models %v, want m and one per backend", v.Data)
	}
	resp, body := do(t, "GET", url+"/version", "")
	if resp.StatusCode != 200 || body != `{"version":"fake"}` || resp.Header.Get(HeaderReplica) == "" {
		t.Errorf("pass-through: status %d body %q replica %q", resp.StatusCode, body, resp.Header.Get(HeaderReplica))
	}
}

// testLogger logs to the test at debug level, so that one line per request
// shows with -v.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func TestSessionSource(t *testing.T) {
	up := newFake(t, 0)
	// Verbatim ids: this test reads which session was taken, not how it
	// is shown (TestDecisionIDsHashed).
	rt, url := startRouter(t, "session-hash", func(c *Config) { c.DebugShowIDs = true }, up.URL)
	convo := func(user string, turns int) string {
		msgs := `{"role":"system","content":"be brief"},{"role":"user","content":"first question"}`
		for i := 1; i < turns; i++ {
			msgs += fmt.Sprintf(`,{"role":"assistant","content":"answer %d"},{"role":"user","content":"question %d"}`, i, i)
		}
		if user != "" {
			return `{"model":"m","user":"` + user + `","messages":[` + msgs + `]}`
		}
		return `{"model":"m","messages":[` + msgs + `]}`
	}
	tests := []struct {
		name, body, header    string
		wantSource, wantValue string // wantValue "" means any conv- key
	}{
		{"header", convo("alice", 1), "sess-42", SessionFromHeader, "sess-42"},
		{"user field", convo("alice", 1), "", SessionFromUser, "alice"},
		{"content", convo("", 1), "", SessionFromContent, ""},
		{"content, later turn", convo("", 3), "", SessionFromContent, ""},
	}
	var convKeys []string
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var hdr []string
			if tc.header != "" {
				hdr = []string{"X-Session-ID", tc.header}
			}
			resp, body := do(t, "POST", url+"/v1/chat/completions", tc.body, hdr...)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if d := resp.Header.Get(HeaderDecision); !strings.Contains(d, "session="+tc.wantSource) {
				t.Errorf("%s: got %q, want session=%s", HeaderDecision, d, tc.wantSource)
			}
			rec := rt.Decisions(1)[0]
			if rec.SessionSource != tc.wantSource {
				t.Errorf("session source: got %q, want %q", rec.SessionSource, tc.wantSource)
			}
			switch {
			case tc.wantValue != "" && rec.Session != tc.wantValue:
				t.Errorf("session: got %q, want %q", rec.Session, tc.wantValue)
			case tc.wantValue == "" && !strings.HasPrefix(rec.Session, "conv-"):
				t.Errorf("session: got %q, want a conv- key", rec.Session)
			case tc.wantValue == "":
				convKeys = append(convKeys, rec.Session)
			}
		})
	}
	if len(convKeys) != 2 || convKeys[0] != convKeys[1] {
		t.Errorf("content sessions of one conversation's turns: got %v, want two equal keys", convKeys)
	}
}

// TestDecisionRecordLifecycle: the record exists while the response is
// in flight and is completed with the outcome when it ends.
func TestDecisionRecordLifecycle(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, chunk1)
		w.(http.Flusher).Flush()
		<-release
		io.WriteString(w, usageOnly+done)
	}))
	t.Cleanup(up.Close)
	rt, url := startRouter(t, "kv-aware", nil, up.URL)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(streamReq))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got := rt.Decisions(10)
	if len(got) != 1 || got[0].Outcome != view.OutcomeInFlight || got[0].Replica != up.URL || got[0].ActualCached != -1 || got[0].E2EMS != 0 {
		t.Fatalf("in flight: got %+v, want one in-flight record without outcome figures", got)
	}
	close(release)
	io.ReadAll(resp.Body)
	resp.Body.Close()
	wait.For(t, "the record's outcome", func() bool { return rt.Decisions(1)[0].Outcome != view.OutcomeInFlight })
	rec := rt.Decisions(1)[0]
	if rec.Outcome != view.OutcomeOK || rec.Status != 200 || rec.ActualCached != 64 || rec.PromptTokens != 100 || rec.TTFTMS <= 0 || rec.E2EMS < rec.TTFTMS {
		t.Errorf("finished: got %+v, want ok 200 with 64 of 100 cached and TTFT ≤ E2E", rec)
	}
	if len(rec.Candidates) != 1 || rec.Index != "approximate" {
		t.Errorf("candidates %+v index %q, want one candidate, approximate", rec.Candidates, rec.Index)
	}
}

package proxy

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/sse"
)

// TestCutInFlight: a drain turns /readyz to 503 while a stream goes on;
// cutting it ends it cleanly (no transport error) with a final OpenAI
// error event, code server_shutting_down, counted; no [DONE] follows. A
// request not answered yet gets a JSON 503 with Retry-After.
func TestCutInFlight(t *testing.T) {
	slow := replicas(t, 1, 1)[0] // real time: 2,000 tokens take seconds
	rt, api, admin := surfaceRouter(t, nil, slow.URL())
	body := `{"model":"m","stream":true,"max_tokens":2000,"messages":[{"role":"user","content":"tell me a long story"}]}`
	resp, err := http.Post(api+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "data: {") {
		t.Fatalf("first line %q, want a data event", sc.Text())
	}
	// A request with no answer yet: not streamed, its replica answers
	// at the end of its 2,000 tokens.
	unanswered := make(chan *http.Response, 1)
	go func() {
		r, err := http.Post(api+"/v1/chat/completions", "application/json", strings.NewReader(strings.Replace(body, `"stream":true`, `"stream":false`, 1)))
		if err != nil {
			t.Error(err)
		}
		unanswered <- r
	}()
	wait.For(t, "two requests in flight", func() bool { return rt.InFlight() >= 2 })
	rt.Drain()
	r, out := do(t, "GET", admin+"/readyz", "")
	if r.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz while draining: status %d, want 503", r.StatusCode)
	}
	wantError(t, "/readyz while draining", out, "draining")
	if n := rt.InFlight(); n != 2 {
		t.Errorf("in flight %d, want 2", n)
	}
	start := time.Now()
	if n := rt.CutInFlight("the router is shutting down"); n != 2 {
		t.Errorf("cut %d, want 2", n)
	}
	if r := <-unanswered; r != nil {
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
			t.Errorf("the unanswered request: status %d, Retry-After %q; want 503 with one", r.StatusCode, r.Header.Get("Retry-After"))
		}
		wantError(t, "the unanswered request", string(b), codeShuttingDown)
	}
	var last string
	for sc.Scan() {
		if l := sc.Text(); l != "" {
			last = l
		}
	}
	if err := sc.Err(); err != nil {
		t.Errorf("reading the cut stream: %v, want a clean end", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the stream ended %v after the cut, want at once", d)
	}
	var e apiError
	data, _ := strings.CutPrefix(last, "data: ")
	if err := json.Unmarshal([]byte(data), &e); err != nil || e.Error.Code != codeShuttingDown {
		t.Errorf("last event %q, want an error event with code %s", last, codeShuttingDown)
	}
	if got := metricValue(t, admin, "kvrouter_errors_total", "code", codeShuttingDown); got != 2 {
		t.Errorf("server_shutting_down counted %v, want 2", got)
	}
	wait.For(t, "no request in flight after the cut", func() bool { return rt.InFlight() == 0 })
}

// TestTrackedTail: the cut closes a partial event before its own.
func TestTrackedTail(t *testing.T) {
	for _, tc := range []struct {
		writes []string
		closed bool
	}{
		{[]string{"data: a\n\n"}, true},
		{[]string{"data: a\n", "\n"}, true},
		{[]string{"data: a\r\n", "\r\n"}, true},
		{[]string{"data: a\n\n", "data: b"}, false},
		{[]string{"d", "a", "t"}, false},
	} {
		var tr tracked
		for _, w := range tc.writes {
			tr.note([]byte(w))
		}
		if got := sse.Closed(tr.tail[len(tr.tail)-tr.n:]); got != tc.closed {
			t.Errorf("%q: closed %v, want %v", tc.writes, got, tc.closed)
		}
	}
}

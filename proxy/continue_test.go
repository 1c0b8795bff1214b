package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/emulator"
)

// faulty serves an emulated engine's API, but its streamed responses fail
// after passing the first after events: cut (the connection closed, as
// when the engine is killed) or stalled (nothing more sent, as when it is
// stopped, until the router gives up).
type faulty struct {
	h     http.Handler
	after int
	stall bool
	// cutJSON cuts non-streaming answers halfway through their body.
	cutJSON bool
	hits    atomic.Int64 // completion requests
}

func (f *faulty) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		f.h.ServeHTTP(w, r)
		return
	}
	f.hits.Add(1)
	f.h.ServeHTTP(&failingWriter{ResponseWriter: w, r: r, f: f}, r)
}

// failingWriter counts the SSE events written and fails past the limit.
type failingWriter struct {
	http.ResponseWriter
	r      *http.Request
	f      *faulty
	events int
	dead   bool
}

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.dead {
		return 0, http.ErrHandlerTimeout
	}
	if w.f.cutJSON && !strings.HasPrefix(string(p), "data: ") {
		w.dead = true
		w.ResponseWriter.Write(p[:len(p)/2])
		if conn, _, err := http.NewResponseController(w.ResponseWriter).Hijack(); err == nil {
			conn.Close()
		}
		return 0, http.ErrHandlerTimeout
	}
	if strings.HasPrefix(string(p), "data: ") {
		w.events++
	}
	if w.events <= w.f.after {
		return w.ResponseWriter.Write(p)
	}
	w.dead = true
	if w.f.stall {
		<-w.r.Context().Done()
	} else if conn, _, err := http.NewResponseController(w.ResponseWriter).Hijack(); err == nil {
		conn.Close()
	}
	return 0, http.ErrHandlerTimeout
}

func (w *failingWriter) Flush() { http.NewResponseController(w.ResponseWriter).Flush() }

// replyEvents reads a stream to its end and returns its data payloads.
func replyEvents(t *testing.T, url, body string) (*http.Response, []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading the stream: %v (events so far %q)", err, out)
	}
	return resp, out
}

// reply is what a client makes of a chat stream.
type reply struct {
	IDs        map[string]int // chunk id → chunks
	Roles      int            // chunks with the assistant role
	Text       string
	Completion int    // usage.completion_tokens, -1 without
	Done       bool   // ended with [DONE]
	ErrCode    string // the error event's code, "" without
}

func readReply(t *testing.T, events []string) reply {
	t.Helper()
	r := reply{IDs: map[string]int{}, Completion: -1}
	for i, ev := range events {
		if ev == "[DONE]" {
			r.Done = i == len(events)-1
			continue
		}
		var c struct {
			ID      string `json:"id"`
			Choices []struct {
				Delta struct {
					Role    string  `json:"role"`
					Content *string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			Error *struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(ev), &c); err != nil {
			t.Fatalf("event %d is not JSON: %q", i, ev)
		}
		if c.Error != nil {
			r.ErrCode = c.Error.Code
			continue
		}
		r.IDs[c.ID]++
		for _, ch := range c.Choices {
			if ch.Delta.Role == "assistant" {
				r.Roles++
			}
			if ch.Delta.Content != nil {
				r.Text += *ch.Delta.Content
			}
		}
		if c.Usage != nil {
			r.Completion = c.Usage.CompletionTokens
		}
	}
	return r
}

// wholeReply asks a healthy engine directly for the reply, not streamed.
func wholeReply(t *testing.T, engine, body string) string {
	t.Helper()
	resp, err := http.Post(engine+"/v1/chat/completions", "application/json", strings.NewReader(strings.Replace(body, `"stream":true`, `"stream":false`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || len(r.Choices) != 1 {
		t.Fatalf("whole reply: %v", err)
	}
	return r.Choices[0].Message.Content
}

// faultyFleet starts a faulty replica (first) and a good one behind a
// round-robin router, so that every other request starts on the faulty one.
func faultyFleet(t *testing.T, f *faulty, mod func(*Config)) (good *emulator.Server, url string) {
	t.Helper()
	reps := replicas(t, 2, 0.01)
	f.h = reps[0].Handler()
	bad := httptest.NewServer(f)
	t.Cleanup(bad.Close)
	rt, url := startRouter(t, "round-robin", mod, bad.URL, reps[1].URL())
	runRouter(t, rt)
	return reps[1], url
}

const continueReq = `{"model":"m","stream":true,"max_tokens":12,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"tell me"}]}`

// TestStreamContinuedAfterCut cuts streams after the role chunk and three
// tokens: each client still gets the whole reply once, as one stream (one
// chunk id, one role chunk, the engine's own text, usage for 12 tokens,
// [DONE]), and /metrics counts the continuations.
func TestStreamContinuedAfterCut(t *testing.T) {
	for _, stall := range []bool{false, true} {
		name := map[bool]string{false: "cut", true: "stalled"}[stall]
		t.Run(name, func(t *testing.T) {
			f := &faulty{after: 4, stall: stall}
			good, url := faultyFleet(t, f, func(c *Config) { c.StreamIdleTimeout = 300 * time.Millisecond })
			want := wholeReply(t, good.URL(), continueReq)
			for i := range 4 {
				start := time.Now()
				_, events := replyEvents(t, url, continueReq)
				got := readReply(t, events)
				if got.Text != want || !got.Done || got.ErrCode != "" || got.Roles != 1 || len(got.IDs) != 1 || got.Completion != 12 {
					t.Errorf("request %d: got %+v, want text %q once, one id, one role chunk, 12 tokens, [DONE]", i, got, want)
				}
				if d := time.Since(start); stall && d > 5*time.Second {
					t.Errorf("request %d took %v with a 300ms idle timeout", i, d)
				}
			}
			if f.hits.Load() == 0 {
				t.Fatal("no request went to the faulty replica")
			}
			if got := metricValue(t, url, "kvrouter_stream_failures_total", "result", midContinued); got < 1 {
				t.Errorf("kvrouter_stream_failures_total{result=continued} = %v, want at least 1", got)
			}
			if stall {
				if got := metricValue(t, url, "kvrouter_upstream_timeouts_total", "kind", timeoutIdle); got < 1 {
					t.Errorf("kvrouter_upstream_timeouts_total{kind=idle} = %v, want at least 1", got)
				}
			}
		})
	}
}

// TestCompletionContinued cuts /v1/completions streams: the client gets
// max_tokens tokens in all, the partial text first, one id, and [DONE].
func TestCompletionContinued(t *testing.T) {
	f := &faulty{after: 3}
	_, url := faultyFleet(t, f, nil)
	const body = `{"model":"m","stream":true,"max_tokens":10,"stream_options":{"include_usage":true},"prompt":"once upon a time"}`
	for i := range 2 {
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var ids = map[string]bool{}
		var text string
		usage, done := -1, false
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			d, ok := strings.CutPrefix(sc.Text(), "data: ")
			if !ok {
				continue
			}
			if d == "[DONE]" {
				done = true
				continue
			}
			var c struct {
				ID      string `json:"id"`
				Choices []struct {
					Text string `json:"text"`
				} `json:"choices"`
				Usage *struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			json.Unmarshal([]byte(d), &c)
			ids[c.ID] = true
			for _, ch := range c.Choices {
				text += ch.Text
			}
			if c.Usage != nil {
				usage = c.Usage.CompletionTokens
			}
		}
		resp.Body.Close()
		if !done || len(ids) != 1 || usage != 10 || emulator.CountTokens(text) != 10 {
			t.Errorf("request %d: done %v, ids %v, usage %d, text %q (%d tokens); want [DONE], one id, 10 tokens", i, done, ids, usage, text, emulator.CountTokens(text))
		}
	}
	if got := metricValue(t, url, "kvrouter_stream_failures_total", "result", midContinued); got < 1 {
		t.Errorf("continuations: got %v, want at least 1", got)
	}
}

// TestNonStreamingRetried cuts non-streaming answers halfway: nothing
// reached the client (the router reads them whole first), so each is
// retried and the client gets the whole answer.
func TestNonStreamingRetried(t *testing.T) {
	f := &faulty{cutJSON: true}
	good, url := faultyFleet(t, f, nil)
	const body = `{"model":"m","max_tokens":6,"messages":[{"role":"user","content":"hi"}]}`
	want := wholeReply(t, good.URL(), body)
	for i := range 4 {
		resp, got := do(t, "POST", url+"/v1/chat/completions", body)
		var r struct {
			Choices []struct {
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(got), &r); err != nil || resp.StatusCode != 200 || len(r.Choices) != 1 || r.Choices[0].Message.Content != want {
			t.Errorf("request %d: status %d, body %q; want 200 with %q", i, resp.StatusCode, got, want)
		}
	}
	if f.hits.Load() == 0 {
		t.Fatal("no request went to the faulty replica")
	}
}

// TestFirstTokenRetried: a replica that sends its headers and the role
// chunk and then dies has sent no token: the request is retried on the
// other replica and the client sees one clean stream from it.
func TestFirstTokenRetried(t *testing.T) {
	f := &faulty{after: 1}
	good, url := faultyFleet(t, f, nil)
	want := wholeReply(t, good.URL(), continueReq)
	for i := range 4 {
		resp, events := replyEvents(t, url, continueReq)
		got := readReply(t, events)
		if got.Text != want || !got.Done || got.Roles != 1 || resp.Header.Get(HeaderReplica) != good.URL() {
			t.Errorf("request %d: got %+v from %s, want the whole reply from %s", i, got, resp.Header.Get(HeaderReplica), good.URL())
		}
	}
	if f.hits.Load() == 0 {
		t.Fatal("no request went to the faulty replica")
	}
	if got := metricValue(t, url, "kvrouter_stream_failures_total", "result", midContinued); got != 0 {
		t.Errorf("continuations: got %v, want 0 (nothing had reached the client)", got)
	}
}

// TestStreamCutNoOtherReplica: with nobody to continue on, a cut stream
// ends with an OpenAI-shaped error event after the text already sent.
func TestStreamCutNoOtherReplica(t *testing.T) {
	reps := replicas(t, 1, 0.01)
	f := &faulty{h: reps[0].Handler(), after: 4}
	bad := httptest.NewServer(f)
	defer bad.Close()
	rt, url := startRouter(t, "round-robin", nil, bad.URL)
	runRouter(t, rt)
	_, events := replyEvents(t, url, continueReq)
	got := readReply(t, events)
	if got.Done || got.ErrCode != codeStreamCut || got.Text == "" {
		t.Errorf("got %+v, want partial text, then an error event %s and no [DONE]", got, codeStreamCut)
	}
	if got := metricValue(t, url, "kvrouter_stream_failures_total", "result", midError); got != 1 {
		t.Errorf("kvrouter_stream_failures_total{result=error} = %v, want 1", got)
	}
}

// TestTTFTTimeout504: a replica that never sends a token, alone, gets the
// client an OpenAI-shaped 504 after the TTFT timeout.
func TestTTFTTimeout504(t *testing.T) {
	reps := replicas(t, 1, 0.01)
	f := &faulty{h: reps[0].Handler(), after: 0, stall: true}
	bad := httptest.NewServer(f)
	defer bad.Close()
	rt, url := startRouter(t, "round-robin", func(c *Config) { c.TTFTTimeout = 200 * time.Millisecond }, bad.URL)
	runRouter(t, rt)
	start := time.Now()
	resp, body := do(t, "POST", url+"/v1/chat/completions", continueReq)
	var e apiError
	if err := json.Unmarshal([]byte(body), &e); err != nil || resp.StatusCode != http.StatusGatewayTimeout || e.Error.Code != codeUpstreamTimeout {
		t.Fatalf("got %d %q, want 504 with code %s", resp.StatusCode, body, codeUpstreamTimeout)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("took %v with a 200ms TTFT timeout (and 2 retries on the same, only, replica)", d)
	}
	if got := metricValue(t, url, "kvrouter_upstream_timeouts_total", "kind", timeoutTTFT); got < 1 {
		t.Errorf("kvrouter_upstream_timeouts_total{kind=ttft} = %v, want at least 1", got)
	}
}

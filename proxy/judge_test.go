package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// liar is a replica that looks healthy and idle (its /health,
// /v1/models and /metrics answer as an idle engine's do) and answers every POST with status 200 and
// something that is not a completion: contentType and body. It counts
// the POSTs it received.
type liar struct {
	*httptest.Server
	posts atomic.Int64
}

func newLiar(t *testing.T, contentType, body string) *liar {
	t.Helper()
	l := &liar{}
	l.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			return
		case "/v1/models":
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
			return
		case "/metrics": // always idle
			io.WriteString(w, "vllm:num_requests_running{model_name=\"m\"} 0\nvllm:num_requests_waiting{model_name=\"m\"} 0\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0\n")
			return
		}
		io.Copy(io.Discard, r.Body)
		if r.Method == http.MethodPost {
			l.posts.Add(1)
		}
		w.Header().Set("Content-Type", contentType)
		io.WriteString(w, body)
	}))
	t.Cleanup(l.Close)
	return l
}

// validAnswer sends request i and fails t unless the answer is a
// completion: a JSON body with a choice, or a stream with a content chunk
// and [DONE].
func validAnswer(t *testing.T, url string, stream bool, i int) {
	body := fmt.Sprintf(`{"model":"m","stream":%t,"max_tokens":2,"messages":[{"role":"user","content":"q%d %s"}]}`, stream, i, words(i, 8))
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Errorf("request %d: %v", i, err)
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Errorf("request %d: status %d: %s", i, resp.StatusCode, b)
		return
	}
	if !stream {
		var c struct{ Choices []json.RawMessage }
		if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || len(c.Choices) == 0 {
			t.Errorf("request %d: got %d choices (%v), want a completion", i, len(c.Choices), err)
		}
		return
	}
	content, done := false, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, _ := strings.CutPrefix(sc.Text(), "data: ")
		content = content || strings.Contains(data, `"content":"`)
		done = done || data == "[DONE]"
	}
	if !content || !done {
		t.Errorf("request %d: stream with content %t, [DONE] %t; want both", i, content, done)
	}
}

// TestLiarEjected: a replica answering every POST with 200 and no
// completion (JSON without choices; JSON to a streamed request; a stream
// with no completion chunk before [DONE]) beside three emulated replicas
// is ejected by its failures, every client gets a valid answer (each
// failed attempt retried elsewhere), and after the ejection the liar
// receives at most 1% of the requests. Before the router judged answers
// by content it drew most of the traffic, being always idle.
func TestLiarEjected(t *testing.T) {
	cases := []struct {
		name, contentType, body, kind string
		stream                        bool
	}{
		{"json without choices", "application/json", `{"id":"x","object":"chat.completion"}`, invalidNoChoices, false},
		{"json to a stream", "application/json", `{"id":"x","object":"chat.completion"}`, invalidContentType, true},
		{"stream without a chunk", "text/event-stream", ": hello\n\ndata: [DONE]\n\n", invalidNoChunk, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			liar := newLiar(t, tc.contentType, tc.body)
			backends := append(urls(replicas(t, 3, 0.01)), liar.URL)
			// least-loaded: the policy an always idle liar fools most.
			rt, url := startRouter(t, "least-loaded", func(c *Config) {
				// Ejections outlast the test: re-admission by probes
				// after EjectBase is health's, tested there; here
				// the claim is the share after the ejection.
				c.Outlier.EjectBase, c.Outlier.EjectMax = time.Hour, time.Hour
			}, backends...)
			runRouter(t, rt)

			// Batches of concurrent requests, as the liar, always idle,
			// draws traffic under load, until it is ejected.
			sent := 0
			for ; rt.st.fleet.Healthy(liar.URL); sent += 16 {
				if sent == 400 {
					t.Fatalf("the liar is still in service after %d requests (it received %d)", sent, liar.posts.Load())
				}
				flood(t, url, tc.stream, sent, 16)
			}
			before := liar.posts.Load()
			const n = 300
			flood(t, url, tc.stream, sent, n)
			if got := liar.posts.Load() - before; got > n/100 {
				t.Errorf("the liar received %d of %d requests after its ejection, want at most 1%%", got, n)
			}
			mfs := families(t, url)
			if got := total(mfs, "kvrouter_upstream_invalid_total", "replica", liar.URL, "kind", tc.kind); got < float64(before) {
				t.Errorf("kvrouter_upstream_invalid_total{kind=%q} = %v, want the liar's %d answers", tc.kind, got, before)
			}
			if got := total(mfs, "kvrouter_ejections_total", "replica", liar.URL, "kind", "passive"); got != 1 {
				t.Errorf("kvrouter_ejections_total{kind=passive} = %v for the liar, want 1", got)
			}
			t.Logf("ejected after %d requests, %d of them sent to the liar", sent, before)
		})
	}
}

// flood sends requests from..from+n-1 from 8 goroutines, each checked by
// validAnswer.
func flood(t *testing.T, url string, stream bool, from, n int) {
	const workers = 8
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for j := w; j < n; j += workers {
				validAnswer(t, url, stream, from+j)
			}
		})
	}
	wg.Wait()
}

// TestOnlyLiars: when every replica answers 200 without a completion, the
// client gets a 502 upstream_invalid_response after the retries, not the
// answer, and it is counted.
func TestOnlyLiars(t *testing.T) {
	a, b := newLiar(t, "application/json", `{}`), newLiar(t, "text/plain", "hello")
	rt, url := startRouter(t, "kv-aware", nil, a.URL, b.URL)
	runRouter(t, rt)
	resp, body := do(t, "POST", url+"/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
	var e apiError
	if err := json.Unmarshal([]byte(body), &e); err != nil || resp.StatusCode != http.StatusBadGateway || e.Error.Code != codeUpstreamInvalid {
		t.Fatalf("got %d %s, want 502 with code %s", resp.StatusCode, body, codeUpstreamInvalid)
	}
	if got := a.posts.Load() + b.posts.Load(); got != 2 {
		t.Errorf("the liars received %d requests, want 2 (one try each)", got)
	}
	if got := total(families(t, url), "kvrouter_errors_total", "code", codeUpstreamInvalid); got != 1 {
		t.Errorf("kvrouter_errors_total{code=%q} = %v, want 1", codeUpstreamInvalid, got)
	}
}

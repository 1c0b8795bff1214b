package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/view"
)

// pdPolicy sends each request to a decode candidate (a healthy replica:
// never a prefill worker) and, when some prefill worker can take a leg,
// orders the request's blocks from one: both chosen round robin by the
// request's sequence number.
func pdPolicy() route.Policy {
	return route.Func(func(r *route.Request, s *route.Snapshot) route.Decision {
		var dec, pre []int
		for i, rp := range s.Replicas {
			if rp.Healthy {
				dec = append(dec, i)
			}
			if rp.Prefills {
				pre = append(pre, i)
			}
		}
		if len(dec) == 0 {
			return route.Decision{Replica: -1, Reason: route.ReasonNoHealthy}
		}
		d := route.Decision{Replica: dec[int(r.Seq)%len(dec)], Reason: "decode"}
		if len(pre) > 0 {
			d.Reason = route.ReasonTransfer
			d.Transfer = route.Transfer{From: pre[int(r.Seq)%len(pre)], Blocks: max(r.Blocks, 1), Time: 2 * time.Millisecond}
		}
		return d
	})
}

// pdRouter serves a router with policy (nil: pdPolicy) in front of
// backends; mod, if set, changes its config. Its loops do not run: no
// probe marks a failing worker down before the test's request meets it.
func pdRouter(t *testing.T, policy route.Policy, mod func(*Config), backends ...Backend) (*Router, string) {
	t.Helper()
	if policy == nil {
		policy = pdPolicy()
	}
	cfg := DefaultConfig()
	cfg.ClientHeaders = true // the test reads the routing headers
	cfg.Listen, cfg.Backends = "127.0.0.1:0", backends
	cfg.KVTransfer = slices.ContainsFunc(backends, func(b Backend) bool { return b.Role == route.RolePrefill })
	if mod != nil {
		mod(&cfg)
	}
	rt, err := New(cfg, Deps{Registry: prometheus.NewRegistry(), Logger: testLogger(t), Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/", rt.Handler())
	mux.Handle("/metrics", rt.AdminHandler())
	mux.Handle("/debug/", rt.AdminHandler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return rt, srv.URL
}

func prefillWorker(url string) Backend { return Backend{URL: url, Role: route.RolePrefill} }
func decodeWorker(url string) Backend  { return Backend{URL: url, Role: route.RoleDecode} }

// engineTap stands in front of an emulated engine: it records the
// completions it receives (bodies and headers) and passes them on, or
// answers them itself as its fields say.
type engineTap struct {
	h http.Handler
	// strip removes kv_transfer_params before the engine sees the body:
	// it serves the request as an ordinary one.
	strip bool
	// status, if set, answers every completion with it.
	status int
	// hold, if set, is called before the engine serves a completion,
	// with the request; it may block.
	hold func(r *http.Request)

	mu     sync.Mutex
	bodies [][]byte
	hdrs   []http.Header
	srv    *httptest.Server
}

// newTap starts a tap in front of engine e.
func newTap(t *testing.T, e *emulator.Server) *engineTap {
	t.Helper()
	tp := &engineTap{h: e.Handler()}
	tp.srv = httptest.NewServer(tp)
	t.Cleanup(tp.srv.Close)
	return tp
}

func (tp *engineTap) URL() string { return tp.srv.URL }

func (tp *engineTap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasPrefix(r.URL.Path, "/v1/") { // not the side channel's reads
		tp.h.ServeHTTP(w, r)
		return
	}
	body, _ := io.ReadAll(r.Body)
	tp.mu.Lock()
	tp.bodies, tp.hdrs = append(tp.bodies, body), append(tp.hdrs, r.Header.Clone())
	tp.mu.Unlock()
	if tp.status != 0 {
		http.Error(w, `{"error":{"message":"failing on purpose"}}`, tp.status)
		return
	}
	if tp.hold != nil {
		tp.hold(r)
	}
	if tp.strip {
		var m map[string]json.RawMessage
		json.Unmarshal(body, &m)
		delete(m, "kv_transfer_params")
		body, _ = json.Marshal(m)
	}
	r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
	r.Header.Set("Content-Length", fmt.Sprint(len(body)))
	tp.h.ServeHTTP(w, r)
}

// received returns the bodies recorded so far, each decoded.
func (tp *engineTap) received(t *testing.T) []map[string]json.RawMessage {
	t.Helper()
	tp.mu.Lock()
	defer tp.mu.Unlock()
	out := make([]map[string]json.RawMessage, len(tp.bodies))
	for i, b := range tp.bodies {
		if err := json.Unmarshal(b, &out[i]); err != nil {
			t.Fatalf("body %d is not JSON: %s", i, b)
		}
	}
	return out
}

// raw returns body i as received.
func (tp *engineTap) raw(i int) []byte {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.bodies[i]
}

func startEmulator(t *testing.T) *emulator.Server {
	t.Helper()
	e, err := emulator.Start(emulator.Config{Model: "m", Preset: engine.DefaultPreset, TimeScale: 0.02}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// transferText is a prompt of 400 words, a token each.
func transferText() string {
	words := make([]string, 400)
	for i := range words {
		words[i] = "w" + string(rune('a'+i%26)) + string(rune('a'+i/26%26))
	}
	return strings.Join(words, " ")
}

// pdChat is a streamed chat request of about 400 tokens with the
// generation options a prefill leg changes.
func pdChat() string {
	return `{"model":"m","stream":true,"max_tokens":6,"max_completion_tokens":6,"min_tokens":2,` +
		`"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"` + transferText() + `"}]}`
}

// cachedOf is a completion's usage.prompt_tokens_details.cached_tokens.
func cachedOf(t *testing.T, body string) int {
	t.Helper()
	var r struct {
		Usage struct {
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("response %s: %v", body, err)
	}
	return r.Usage.PromptTokensDetails.CachedTokens
}

// streamCached is the cached_tokens of a stream's usage chunk; -1
// without one.
func streamCached(t *testing.T, events []string) int {
	t.Helper()
	for _, ev := range events {
		if strings.Contains(ev, `"cached_tokens"`) {
			return cachedOf(t, ev)
		}
	}
	return -1
}

// wantIdle waits until the fleet holds no load: every ticket released.
func wantIdle(t *testing.T, rt *Router) {
	t.Helper()
	wait.For(t, "the fleet's load released", func() bool {
		for _, r := range rt.st.fleet.View(time.Now()).Replicas {
			if r.InFlight != 0 {
				return false
			}
		}
		return true
	})
}

// settledRecord waits for the last request's outcome and returns its
// record.
func settledRecord(t *testing.T, rt *Router) view.Decision {
	t.Helper()
	wait.For(t, "the request's outcome", func() bool { return rt.Decisions(1)[0].Outcome != view.OutcomeInFlight })
	return rt.Decisions(1)[0]
}

// TestPrefillLegFallback: a prefill leg that fails (an error status, no
// answer within the TTFT timeout, a worker that is down, an answer
// without kv_transfer_params) is counted and the request decided again
// without that worker: here the next decision names the other prefill
// worker, which fails alike, and then the decode replica computes the
// prompt itself. The client gets the engine's whole answer, and nothing
// stays charged.
func TestPrefillLegFallback(t *testing.T) {
	cases := []struct {
		outcome string
		worker  func(t *testing.T) string
	}{
		{legError, func(t *testing.T) string {
			tp := newTap(t, startEmulator(t))
			tp.status = http.StatusServiceUnavailable
			return tp.URL()
		}},
		{legTimeout, func(t *testing.T) string {
			tp := newTap(t, startEmulator(t))
			tp.hold = func(r *http.Request) { <-r.Context().Done() }
			return tp.URL()
		}},
		{legError + "/down", func(t *testing.T) string {
			down := httptest.NewServer(http.NotFoundHandler())
			down.Close()
			return down.URL
		}},
		{legNoParams, func(t *testing.T) string {
			tp := newTap(t, startEmulator(t))
			tp.strip = true // an engine without a KV connector
			return tp.URL()
		}},
	}
	for _, tc := range cases {
		t.Run(tc.outcome, func(t *testing.T) {
			outcome, _, _ := strings.Cut(tc.outcome, "/")
			p1, p2, d := tc.worker(t), tc.worker(t), startEmulator(t)
			rt, url := pdRouter(t, nil, func(c *Config) { c.TTFTTimeout = 300 * time.Millisecond },
				prefillWorker(p1), prefillWorker(p2), decodeWorker(d.URL()))
			body := strings.Replace(pdChat(), `"stream":true`, `"stream":false`, 1)
			resp, out := do(t, "POST", url+"/v1/chat/completions", body)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, out)
			}
			if h := resp.Header.Get(HeaderDecision); strings.Contains(h, "transfer=") {
				t.Errorf("%s %q names a transfer", HeaderDecision, h)
			}
			var r struct {
				Choices []struct {
					Message struct{ Content string } `json:"message"`
				} `json:"choices"`
			}
			json.Unmarshal([]byte(out), &r)
			if want := wholeReply(t, d.URL(), body); len(r.Choices) != 1 || r.Choices[0].Message.Content != want {
				t.Errorf("answer %s, want the engine's %q", out, want)
			}
			rec := settledRecord(t, rt)
			if rec.Transfer != "" || rec.PrefillLegs != 2 || rec.PrefillOutcome != outcome || rec.Replica != d.URL() {
				t.Errorf("record: transfer %q, %d legs, last %q, replica %s; want none, 2, %s, %s", rec.Transfer, rec.PrefillLegs, rec.PrefillOutcome, rec.Replica, outcome, d.URL())
			}
			if got := metricValue(t, url, "kvrouter_kv_transfer_legs_total", "leg", legPrefill, "outcome", outcome); got != 2 {
				t.Errorf("prefill legs %s: %v, want 2", outcome, got)
			}
			if got := metricValue(t, url, "kvrouter_kv_transfer_fallbacks_total", "reason", outcome); got != 2 {
				t.Errorf("fallbacks %s: %v, want 2", outcome, got)
			}
			if got := metricValue(t, url, "kvrouter_kv_transfers_total"); got != 0 {
				t.Errorf("%v transfers counted", got)
			}
			wantIdle(t, rt)
		})
	}
}

// TestPrefillLegsBounded: a request runs at most 1 + --retries prefill
// legs; past that the decode replica computes the prompt.
func TestPrefillLegsBounded(t *testing.T) {
	var ps []*engineTap
	for range 2 {
		tp := newTap(t, startEmulator(t))
		tp.status = http.StatusInternalServerError
		ps = append(ps, tp)
	}
	d := startEmulator(t)
	rt, url := pdRouter(t, nil, func(c *Config) { c.Retries = 0 }, prefillWorker(ps[0].URL()), prefillWorker(ps[1].URL()), decodeWorker(d.URL()))
	if resp, out := do(t, "POST", url+"/v1/completions", `{"model":"m","max_tokens":2,"prompt":"`+transferText()+`"}`); resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	if n := len(ps[0].received(t)) + len(ps[1].received(t)); n != 1 {
		t.Errorf("%d prefill legs, want 1", n)
	}
	if got := metricValue(t, url, "kvrouter_kv_transfer_fallbacks_total", "reason", fallbackExhausted); got != 1 {
		t.Errorf("fallbacks legs_exhausted: %v, want 1", got)
	}
	wantIdle(t, rt)
}

// orderImport is a policy that sends the first request to replica 0 and
// every later one to replica 1, with an import of the prompt's blocks
// from replica 0 (a holder, not a prefill worker).
func orderImport() route.Policy {
	var calls atomic.Int64
	return route.Func(func(r *route.Request, s *route.Snapshot) route.Decision {
		if calls.Add(1) == 1 {
			return route.Decision{Replica: 0, Reason: "warm"}
		}
		return route.Decision{Replica: 1, Reason: route.ReasonTransfer,
			Transfer: route.Transfer{From: 0, Blocks: max(r.Blocks, 1), Time: 3 * time.Millisecond}}
	})
}

// TestKVTransferOff: without --kv-transfer an import from a holder (a
// replica of role both) runs no leg: the body goes to its replica as the
// client sent it; the header, record and metrics name no transfer.
func TestKVTransferOff(t *testing.T) {
	src, dst := newTap(t, startEmulator(t)), newTap(t, startEmulator(t))
	rt, url := pdRouter(t, orderImport(), nil, Backend{URL: src.URL()}, Backend{URL: dst.URL()})
	body := `{"model":"m","max_tokens":2,"prompt":"` + transferText() + `"}`
	do(t, "POST", url+"/v1/completions", body)
	resp, b := do(t, "POST", url+"/v1/completions", body)
	if resp.StatusCode != 200 || resp.Header.Get(HeaderReplica) != dst.URL() {
		t.Fatalf("status %d from %s: %s", resp.StatusCode, resp.Header.Get(HeaderReplica), b)
	}
	if n := len(src.received(t)); n != 1 {
		t.Errorf("the holder got %d requests, want the first alone (no leg)", n)
	}
	if got := dst.raw(0); string(got) != body {
		t.Errorf("the replica got %s, want the client's body", got)
	}
	if h := resp.Header.Get(HeaderDecision); strings.Contains(h, "transfer=") {
		t.Errorf("%s %q names a transfer", HeaderDecision, h)
	}
	if got := metricValue(t, url, "kvrouter_kv_transfer_legs_total"); got != 0 {
		t.Errorf("%v legs with transfers off", got)
	}
	if d := settledRecord(t, rt); d.Transfer != "" || d.PrefillLegs != 0 {
		t.Errorf("record names a transfer: %q, %d legs", d.Transfer, d.PrefillLegs)
	}
}

// TestOwnParamsForwarded: a body with its own kv_transfer_params is
// forwarded untouched, without legs, even when the decision orders a
// transfer from a prefill worker.
func TestOwnParamsForwarded(t *testing.T) {
	p, d := newTap(t, startEmulator(t)), newTap(t, startEmulator(t))
	d.strip = true
	_, url := pdRouter(t, nil, nil, prefillWorker(p.URL()), decodeWorker(d.URL()))
	body := `{"model":"m","max_tokens":2,"kv_transfer_params":{"do_remote_prefill":false},"prompt":"` + transferText() + `"}`
	if resp, b := do(t, "POST", url+"/v1/completions", body); resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if n := len(p.received(t)); n != 0 {
		t.Errorf("the prefill worker got %d legs, want none", n)
	}
	if got := d.raw(0); string(got) != body {
		t.Errorf("the decode worker got %s, want the client's body", got)
	}
}

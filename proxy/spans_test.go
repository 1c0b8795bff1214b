package proxy

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/internal/otlptest"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/tracing"
)

// traceparents records the traceparent header of every completion
// request an engine received.
type traceparents struct {
	h   http.Handler
	url string // the engine's base URL, as the router names it
	mu  sync.Mutex
	// got are the traceparent values, in arrival order.
	got []string
}

func (tp *traceparents) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		tp.mu.Lock()
		tp.got = append(tp.got, r.Header.Get("traceparent"))
		tp.mu.Unlock()
	}
	tp.h.ServeHTTP(w, r)
}

func (tp *traceparents) all() []string {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return append([]string(nil), tp.got...)
}

// unavailable answers every completion 503 (an engine that is up but
// refuses work), and the rest as the emulated engine h does.
func unavailable(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			http.Error(w, `{"error":{"message":"overloaded"}}`, http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// firstHealthy routes every request to the first replica it may use, so
// that a test knows which replica a request starts on.
var firstHealthy = route.Func(func(r *route.Request, s *route.Snapshot) route.Decision {
	for i, rep := range s.Replicas {
		if rep.Healthy {
			return route.Decision{Replica: i, Reason: "first-healthy"}
		}
	}
	return route.Decision{Replica: -1, Reason: route.ReasonNoHealthy}
})

// tracedRouter starts a router exporting its spans through tp, in front
// of engines each behind a traceparent recorder.
func tracedRouter(t *testing.T, tp *tracing.Provider, policy route.Policy, engines ...http.Handler) (*Router, string, []*traceparents) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ClientHeaders = true // the test reads the routing headers
	cfg.Listen = "127.0.0.1:0"
	var recs []*traceparents
	for _, h := range engines {
		rec := &traceparents{h: h}
		srv := httptest.NewServer(rec)
		t.Cleanup(srv.Close)
		rec.url = srv.URL
		cfg.Backends = append(cfg.Backends, Backend{URL: srv.URL})
		recs = append(recs, rec)
	}
	rt, err := New(cfg, Deps{Registry: prometheus.NewRegistry(), Logger: testLogger(t), TracerProvider: tp.TracerProvider(), Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	runRouter(t, rt)
	srv := httptest.NewServer(rt.Handler())
	t.Cleanup(srv.Close)
	return rt, srv.URL, recs
}

// traced is one request's spans as the receiver got them.
type tracedReq struct {
	server  *tracepb.Span
	clients []*tracepb.Span // by start time
}

// spansOf groups the received spans by the server span whose
// kvrouter.request_id is id.
func spansOf(t *testing.T, spans []*tracepb.Span, id string) tracedReq {
	t.Helper()
	var r tracedReq
	for _, s := range spans {
		if s.GetKind() == tracepb.Span_SPAN_KIND_SERVER && otlptest.String(s.GetAttributes(), "kvrouter.request_id") == id {
			r.server = s
		}
	}
	if r.server == nil {
		t.Fatalf("no server span with kvrouter.request_id %q among %d spans", id, len(spans))
	}
	for _, s := range spans {
		if s.GetKind() == tracepb.Span_SPAN_KIND_CLIENT && string(s.GetParentSpanId()) == string(r.server.GetSpanId()) {
			if string(s.GetTraceId()) != string(r.server.GetTraceId()) {
				t.Errorf("client span %x: trace %x, want its parent's %x", s.GetSpanId(), s.GetTraceId(), r.server.GetTraceId())
			}
			r.clients = append(r.clients, s)
		}
	}
	for i := 1; i < len(r.clients); i++ {
		for j := i; j > 0 && r.clients[j].GetStartTimeUnixNano() < r.clients[j-1].GetStartTimeUnixNano(); j-- {
			r.clients[j], r.clients[j-1] = r.clients[j-1], r.clients[j]
		}
	}
	return r
}

// wantTraceparent checks that an engine received the client span s as
// the parent of its request: traceparent 00-<trace id>-<span id>-01.
func wantTraceparent(t *testing.T, rec *traceparents, s *tracepb.Span, what string) {
	t.Helper()
	want := "00-" + hex.EncodeToString(s.GetTraceId()) + "-" + hex.EncodeToString(s.GetSpanId()) + "-01"
	got := rec.all()
	for _, g := range got {
		if g == want {
			return
		}
	}
	t.Errorf("%s: the engine received traceparents %q, want one of them %q (the client span)", what, got, want)
}

func wantAttr(t *testing.T, s *tracepb.Span, key, want string) {
	t.Helper()
	if got, _ := otlptest.Attr(s.GetAttributes(), key); got != want {
		t.Errorf("span %q: %s = %q, want %q", s.GetName(), key, got, want)
	}
}

// TestSpansExported runs routers with tracing on, exporting over
// OTLP/HTTP to a real receiver on loopback, and checks what it decoded:
// per routed request a server span (child of the client's traceparent
// when it sent one) carrying the decision as the response header states
// it (policy, replica, reason, predicted cached tokens, the cost terms),
// and under it one client span per upstream attempt, whose id the engine
// received as its traceparent's parent: one for a plain request, two for
// a request retried after a 503 (the first an error), two for a stream
// continued on another replica after its first replica was cut.
func TestSpansExported(t *testing.T) {
	recv := otlptest.Start(t)
	tp, err := tracing.Start(context.Background(), tracing.Config{Endpoint: recv.URL, Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	if !tp.Enabled() || tp.Endpoint() != recv.URL+"/v1/traces" {
		t.Fatalf("tracing: enabled %v endpoint %q, want on, %s/v1/traces", tp.Enabled(), tp.Endpoint(), recv.URL)
	}
	reps := replicas(t, 4, 0.01)

	// kv-aware over two engines; the client sends its own traceparent.
	kvRT, kvURL, kvRecs := tracedRouter(t, tp, nil, reps[0].Handler(), reps[1].Handler())
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	resp, body := do(t, "POST", kvURL+"/v1/chat/completions", `{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"`+words(3, 200)+`"}]}`,
		"traceparent", parent)
	if resp.StatusCode != 200 {
		t.Fatalf("kv-aware: status %d: %s", resp.StatusCode, body)
	}
	kvDecision, kvReplica := resp.Header.Get(HeaderDecision), resp.Header.Get(HeaderReplica)

	// A 503 on the first replica, retried on the second.
	retryRT, retryURL, retryRecs := tracedRouter(t, tp, firstHealthy, unavailable(reps[2].Handler()), reps[2].Handler())
	resp, events := replyEvents(t, retryURL, continueReq)
	if got := readReply(t, events); resp.StatusCode != 200 || !got.Done {
		t.Fatalf("retry: status %d, reply %+v", resp.StatusCode, got)
	}
	retryDecision := resp.Header.Get(HeaderDecision)

	// A stream cut after its first tokens, continued on the second.
	cut := &faulty{h: reps[3].Handler(), after: 3}
	contRT, contURL, contRecs := tracedRouter(t, tp, firstHealthy, cut, reps[3].Handler())
	resp, events = replyEvents(t, contURL, continueReq)
	if got := readReply(t, events); resp.StatusCode != 200 || !got.Done {
		t.Fatalf("continuation: status %d, reply %+v", resp.StatusCode, got)
	}
	contDecision := resp.Header.Get(HeaderDecision)

	// Shutdown flushes the batch: the receiver has every span when it returns.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, rt := range []*Router{kvRT, retryRT, contRT} {
		// A handler ends its server span after the client read the last byte.
		wait.For(t, "requests finished", func() bool { return rt.InFlight() == 0 })
	}
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	spans, services := recv.Spans()
	for i, svc := range services {
		if svc != "kvrouter" {
			t.Errorf("span %d: service.name %q, want kvrouter", i, svc)
		}
	}

	t.Run("kv-aware", func(t *testing.T) {
		r := spansOf(t, spans, decisionField(kvDecision, "id"))
		s := r.server
		if got := hex.EncodeToString(s.GetTraceId()); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Errorf("server span trace %s, want the client's", got)
		}
		if got := hex.EncodeToString(s.GetParentSpanId()); got != "00f067aa0ba902b7" {
			t.Errorf("server span parent %s, want the client's span 00f067aa0ba902b7", got)
		}
		if s.GetName() != "POST /v1/chat/completions" {
			t.Errorf("server span name %q", s.GetName())
		}
		wantAttr(t, s, "kvrouter.policy", "kv-aware")
		wantAttr(t, s, "kvrouter.replica", kvReplica)
		wantAttr(t, s, "kvrouter.reason", decisionField(kvDecision, "reason"))
		wantAttr(t, s, "kvrouter.predicted_cached_tokens", decisionField(kvDecision, "predicted-cached"))
		wantAttr(t, s, "http.response.status_code", "200")
		wantAttr(t, s, "gen_ai.request.model", "m")
		wantAttr(t, s, "kvrouter.outcome", "ok")
		// GenAI semantic conventions (inference): the operation, the
		// provider, the request's max_tokens, the engine's model, id and
		// usage.
		wantAttr(t, s, "gen_ai.operation.name", "chat")
		wantAttr(t, s, "gen_ai.provider.name", "vllm")
		wantAttr(t, s, "gen_ai.request.max_tokens", "4")
		wantAttr(t, s, "gen_ai.response.model", "m")
		wantAttr(t, s, "gen_ai.usage.output_tokens", "4")
		for _, k := range []string{"gen_ai.response.id", "gen_ai.usage.input_tokens", "gen_ai.usage.cache_read.input_tokens"} {
			if v, ok := otlptest.Attr(s.GetAttributes(), k); !ok || v == "" {
				t.Errorf("no %s", k)
			}
		}
		cost, _ := strconv.ParseFloat(strings.TrimSuffix(decisionField(kvDecision, "cost"), "ms"), 64)
		total, _ := otlptest.Attr(s.GetAttributes(), "kvrouter.cost.total_ms")
		if v, err := strconv.ParseFloat(total, 64); err != nil || fmt.Sprintf("%.3f", v) != fmt.Sprintf("%.3f", cost) || cost <= 0 {
			t.Errorf("kvrouter.cost.total_ms %q, want the decision header's cost %v ms", total, cost)
		}
		for _, k := range []string{"wait_ms", "prefill_ms", "decode_ms", "others_ms", "memory_ms"} {
			if _, ok := otlptest.Attr(s.GetAttributes(), "kvrouter.cost."+k); !ok {
				t.Errorf("no kvrouter.cost.%s", k)
			}
		}
		if len(r.clients) != 1 {
			t.Fatalf("got %d client spans, want 1", len(r.clients))
		}
		c := r.clients[0]
		wantAttr(t, c, "kvrouter.replica", kvReplica)
		wantAttr(t, c, "http.response.status_code", "200")
		for _, rec := range kvRecs {
			if rec.url == kvReplica {
				wantTraceparent(t, rec, c, "the chosen engine")
			} else if got := rec.all(); len(got) != 0 {
				t.Errorf("the engine not chosen received %d requests", len(got))
			}
		}
	})

	t.Run("retry", func(t *testing.T) {
		r := spansOf(t, spans, decisionField(retryDecision, "id"))
		wantAttr(t, r.server, "kvrouter.retries", "1")
		if len(r.clients) != 2 {
			t.Fatalf("got %d client spans, want 2 (the 503, the retry)", len(r.clients))
		}
		first, second := r.clients[0], r.clients[1]
		wantAttr(t, first, "http.response.status_code", "503")
		wantAttr(t, first, "kvrouter.attempt", "1")
		if first.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR {
			t.Errorf("the 503 attempt's status %v, want error", first.GetStatus())
		}
		wantAttr(t, second, "kvrouter.attempt", "2")
		wantAttr(t, second, "http.response.status_code", "200")
		wantAttr(t, second, "kvrouter.continuation", "false")
		wantTraceparent(t, retryRecs[0], first, "the 503 engine")
		wantTraceparent(t, retryRecs[1], second, "the engine retried on")
	})

	t.Run("continuation", func(t *testing.T) {
		r := spansOf(t, spans, decisionField(contDecision, "id"))
		if len(r.clients) != 2 {
			t.Fatalf("got %d client spans, want 2 (the cut stream, its continuation)", len(r.clients))
		}
		wantAttr(t, r.clients[0], "kvrouter.continuation", "false")
		wantAttr(t, r.clients[1], "kvrouter.continuation", "true")
		wantAttr(t, r.server, "kvrouter.outcome", "ok")
		wantTraceparent(t, contRecs[0], r.clients[0], "the cut engine")
		wantTraceparent(t, contRecs[1], r.clients[1], "the engine continued on")
	})
}

// discard is a span exporter that drops what it is given.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// BenchmarkSpans measures what tracing adds to a routed request with one
// upstream attempt: the server span (the client's traceparent read, the
// decision's attributes set), the client span, and both handed to a
// batching processor whose exporter drops them.
//
//	go test -run='^$' -bench=Spans -benchmem ./proxy
func BenchmarkSpans(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}))
	defer tp.Shutdown(context.Background())
	u, _ := url.Parse("http://10.0.0.1:8000")
	rt := &Router{st: &state{}, policyName: "kv-aware"}
	rt.st.bes.setLocked(0, &backend{cfg: Backend{URL: u.String()}, url: u})
	rt.tracer, _ = newTracer(tp, http.DefaultTransport)
	req := httptest.NewRequest("POST", "/v1/chat/completions", nil)
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	costs := []route.Cost{{Replica: 0, Matched: 1024, Wait: time.Millisecond, Prefill: 20 * time.Millisecond, Total: 30 * time.Millisecond}}
	b.ReportAllocs()
	for b.Loop() {
		c := &call{rt: rt, bufs: newBufs(), id: "kvr-abc-1", method: "POST", path: req.URL.Path, replica: 0, routed: true, usage: fleet.NoUsage}
		r := c.startSpan(req)
		c.dec = route.Decision{Replica: 0, Reason: "least-cost", Matched: 1024, Costs: costs}
		ctx, span := c.startAttempt(r.Context())
		a := &attempt{ctx: ctx, span: span}
		a.endSpan()
		c.status, c.outcome, c.end = 200, "ok", time.Now()
		c.endSpan()
	}
}

// TestPrefillLegTraced: a disaggregated request's prefill leg is a
// client span under the request's server span, before its decode
// attempt; the prefill worker receives it as its traceparent's parent;
// the server span and the access log line name the leg and the
// transfer.
func TestPrefillLegTraced(t *testing.T) {
	recv := otlptest.Start(t)
	tp, err := tracing.Start(context.Background(), tracing.Config{Endpoint: recv.URL, Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	answer := nixlAnswer(t)
	pRec := &traceparents{h: &fixtureWorker{answer: answer}}
	p := httptest.NewServer(pRec)
	t.Cleanup(p.Close)
	d := newTap(t, startEmulator(t))
	d.strip = true
	var log syncBuffer
	cfg := DefaultConfig()
	cfg.ClientHeaders = true // the test reads the routing headers
	cfg.Listen, cfg.Backends, cfg.KVTransfer = "127.0.0.1:0", []Backend{prefillWorker(p.URL), decodeWorker(d.URL())}, true
	rt, err := New(cfg, Deps{Registry: prometheus.NewRegistry(), Logger: slog.New(slog.NewJSONHandler(&log, nil)),
		TracerProvider: tp.TracerProvider(), Policy: pdPolicy()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(rt.Handler())
	t.Cleanup(srv.Close)
	resp, events := replyEvents(t, srv.URL, pdChat())
	if got := readReply(t, events); resp.StatusCode != 200 || !got.Done {
		t.Fatalf("status %d, reply %+v", resp.StatusCode, got)
	}
	wait.For(t, "the request finished", func() bool { return rt.InFlight() == 0 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	spans, _ := recv.Spans()
	id := decisionField(resp.Header.Get(HeaderDecision), "id")
	r := spansOf(t, spans, id)
	if len(r.clients) != 2 {
		t.Fatalf("got %d client spans, want 2 (the prefill leg, the decode leg)", len(r.clients))
	}
	leg := r.clients[0]
	wantAttr(t, leg, "kvrouter.leg", legPrefill)
	wantAttr(t, leg, "kvrouter.leg.outcome", legOK)
	wantAttr(t, leg, "kvrouter.replica", p.URL)
	wantAttr(t, r.clients[1], "kvrouter.replica", d.URL())
	wantAttr(t, r.server, "kvrouter.transfer.from", p.URL)
	wantAttr(t, r.server, "kvrouter.transfer.tokens", "421")
	wantTraceparent(t, pRec, leg, "the prefill worker")

	var line map[string]any
	for _, m := range jsonLines(t, log.String()) {
		if m["msg"] == "request" && m["id"] == id {
			line = m
		}
	}
	want := map[string]any{"prefill_replica": p.URL, "prefill_outcome": legOK, "prefill_legs": 1.0, "transfer_tokens": 421.0}
	for k, v := range want {
		if line[k] != v {
			t.Errorf("access log %s = %v, want %v", k, line[k], v)
		}
	}
	if ms, _ := line["prefill_ms"].(float64); ms <= 0 {
		t.Errorf("access log prefill_ms = %v, want the leg's duration", line["prefill_ms"])
	}
}

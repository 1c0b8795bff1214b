package epp

import (
	"bytes"
	"context"
	"encoding/json"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	procv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/proxy"
)

var modes = []procv3.ProcessingMode_BodySendMode{procv3.ProcessingMode_FULL_DUPLEX_STREAMED, procv3.ProcessingMode_BUFFERED}

var predictedRe = regexp.MustCompile(`predicted-cached=(\d+)`)

// predicted is the predicted-cached figure of a decision header.
func predicted(t *testing.T, decision string) int {
	t.Helper()
	m := predictedRe.FindStringSubmatch(decision)
	if m == nil {
		t.Fatalf("decision header %q has no predicted-cached", decision)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// cachedTokens is usage.prompt_tokens_details.cached_tokens of a
// completion body.
func cachedTokens(t *testing.T, body []byte) int {
	t.Helper()
	var r struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   struct {
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &r); err != nil || len(r.Choices) == 0 {
		t.Fatalf("response body %q: %v", body, err)
	}
	return r.Usage.PromptTokensDetails.CachedTokens
}

// hostOf is a replica URL's host:port.
func hostOf(t *testing.T, u string) string {
	t.Helper()
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	return p.Host
}

// TestRepeatGoesToThePrefix: a long prompt sent twice, under two session
// ids (so no session pin explains it), goes to the same engine the second
// time, with the prefix predicted cached and the engine reporting it
// cached; the picker sets the same endpoint in the header and the
// metadata, and passes the body through unchanged. In both body modes.
func TestRepeatGoesToThePrefix(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			f := start(t, 3, Config{}, nil)
			hosts := map[string]bool{}
			for _, s := range f.reps {
				hosts[hostOf(t, s.URL())] = true
			}
			prompt := words(7, 400)
			var eps []string
			for i, session := range []string{"a", "b"} {
				r := chat("m", session, prompt, false)
				r.mode = mode
				ex := f.do(t, r)
				if ex.immediate != nil {
					t.Fatalf("request %d: immediate response %d %s", i, ex.immediate.GetStatus().GetCode(), ex.immediate.GetBody())
				}
				if !hosts[ex.endpoint] || ex.metadata != ex.list {
					t.Fatalf("request %d: header endpoint %q, metadata %q; want the same replica's host:port of %v", i, ex.endpoint, ex.metadata, hosts)
				}
				if !bytes.Equal(ex.sentBody, r.chunks[0]) {
					t.Errorf("request %d: body forwarded %q, want it unchanged %q", i, ex.sentBody, r.chunks[0])
				}
				if ex.status != 200 {
					t.Fatalf("request %d: engine status %d: %s", i, ex.status, ex.respBody)
				}
				if got := ex.respHeaders[strings.ToLower(proxy.HeaderReplica)]; hostOf(t, got) != ex.endpoint {
					t.Errorf("request %d: response replica header %q, want endpoint %s", i, got, ex.endpoint)
				}
				pred := predicted(t, ex.respHeaders[strings.ToLower(proxy.HeaderDecision)])
				cached := cachedTokens(t, ex.respBody)
				t.Logf("request %d → %s: predicted cached %d, engine cached %d", i, ex.endpoint, pred, cached)
				if i == 0 && pred != 0 {
					t.Errorf("first request: predicted cached %d, want 0", pred)
				}
				if i == 1 && (pred < 200 || cached < 200) {
					t.Errorf("repeat: predicted cached %d, engine cached %d; want both ≥ 200 tokens of a 400-word prompt", pred, cached)
				}
				eps = append(eps, ex.endpoint)
			}
			if eps[0] != eps[1] {
				t.Errorf("repeat went to %s, first to %s", eps[1], eps[0])
			}
			if got := f.metric(t, "kvrouter_epp_requests_total", "result", "routed"); got != 2 {
				t.Errorf("kvrouter_epp_requests_total{result=routed} = %v, want 2", got)
			}
		})
	}
}

// TestLoadHeldUntilTheResponseEnds: the replica the picker chose carries
// the request in flight from the pick until the response's last chunk,
// and none after; a streamed response's usage (read from its last SSE
// chunks) and first byte reach the decision record.
func TestLoadHeldUntilTheResponseEnds(t *testing.T) {
	f := start(t, 2, Config{}, nil)
	inFlight := func(endpoint string) int {
		for _, r := range f.rt.View(time.Now()).Replicas {
			if hostOf(t, r.ID) == endpoint {
				return r.InFlight
			}
		}
		t.Fatalf("no replica %s", endpoint)
		return -1
	}
	prompt := words(3, 300)
	for i := range 2 {
		r := chat("m", "s", prompt, true)
		held := -1
		r.hold = func(ep string) { held = inFlight(ep) }
		ex := f.do(t, r)
		if ex.immediate != nil || ex.status != 200 {
			t.Fatalf("request %d: immediate %v, status %d", i, ex.immediate, ex.status)
		}
		if held != 1 {
			t.Errorf("request %d: %d in flight on %s between pick and response, want 1", i, held, ex.endpoint)
		}
		if got := inFlight(ex.endpoint); got != 0 {
			t.Errorf("request %d: %d in flight on %s after the response ended, want 0", i, got, ex.endpoint)
		}
		if !bytes.HasSuffix(ex.respBody, []byte("data: [DONE]\n\n")) {
			t.Errorf("request %d: streamed body not passed through whole: %q", i, ex.respBody[max(0, len(ex.respBody)-60):])
		}
	}
	recs := f.rt.Decisions(1)
	if len(recs) != 1 || recs[0].Outcome != "ok" || recs[0].ActualCached <= 0 || recs[0].TTFTMS <= 0 {
		t.Fatalf("last decision %+v: want outcome ok, the engine's cached tokens and a TTFT", recs)
	}
}

// TestImmediateErrors: a request the picker cannot route is answered at
// once with an ImmediateResponse carrying an OpenAI-style error, never a
// panic or a hung stream, and counted; the picker then routes the next
// request as before.
func TestImmediateErrors(t *testing.T) {
	f := start(t, 2, Config{MaxBodyBytes: 4096}, nil)
	// An unknown model is answered 404 once the replicas' models are
	// listed; until then every model is taken to be served.
	wait.For(t, "the replicas' models listed", func() bool {
		v := f.rt.View(time.Now())
		return v.Replicas[0].ModelsKnown && v.Replicas[1].ModelsKnown
	})
	ok := chat("m", "s", "hello", false)
	big := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 5000) + `"}]}`)
	cases := []struct {
		name   string
		r      func() req
		status int
		code   string
	}{
		{"malformed", func() req { r := ok; r.chunks = [][]byte{[]byte(`{"model":"m","messages":[`)}; return r }, 400, "invalid_json"},
		{"malformed buffered", func() req {
			r := ok
			r.mode, r.chunks = procv3.ProcessingMode_BUFFERED, [][]byte{[]byte(`not json`)}
			return r
		}, 400, "invalid_json"},
		{"oversized in chunks", func() req { r := ok; r.chunks = [][]byte{big[:2000], big[2000:4000], big[4000:]}; return r }, 413, "request_too_large"},
		{"oversized at once", func() req { r := ok; r.chunks = [][]byte{big}; return r }, 413, "request_too_large"},
		{"oversized buffered", func() req { r := ok; r.mode, r.chunks = procv3.ProcessingMode_BUFFERED, [][]byte{big}; return r }, 413, "request_too_large"},
		{"cut at Envoy's buffer", func() req {
			r := ok
			r.mode, r.open = procv3.ProcessingMode_BUFFERED_PARTIAL, true
			return r
		}, 413, "request_too_large"},
		{"no body", func() req { r := ok; r.chunks = nil; return r }, 400, "invalid_json"},
		{"unknown model", func() req { return chat("nope", "s", "hello", false) }, 404, "model_not_found"},
		{"empty subset", func() req { r := ok; r.subset = []string{}; return r }, 503, "no_healthy_replica"},
		{"no pool endpoint in the subset", func() req { r := ok; r.subset = []string{"10.255.0.1:8000"}; return r }, 503, "no_healthy_replica"},
		{"streamed mode", func() req { r := ok; r.mode = procv3.ProcessingMode_STREAMED; return r }, 500, "unsupported_body_mode"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ex := f.do(t, c.r())
			ir := ex.immediate
			if ir == nil {
				t.Fatalf("routed to %q, want an immediate %d", ex.endpoint, c.status)
			}
			var e struct {
				Error struct{ Code string } `json:"error"`
			}
			if err := json.Unmarshal(ir.GetBody(), &e); err != nil {
				t.Fatalf("immediate body %q: %v", ir.GetBody(), err)
			}
			if int(ir.GetStatus().GetCode()) != c.status || e.Error.Code != c.code {
				t.Errorf("got %d %q, want %d %q (%s)", ir.GetStatus().GetCode(), e.Error.Code, c.status, c.code, ir.GetBody())
			}
		})
	}
	if got := f.metric(t, "kvrouter_epp_errors_total", "code", "request_too_large"); got != 4 {
		t.Errorf("kvrouter_epp_errors_total{code=request_too_large} = %v, want 4", got)
	}
	if got := f.metric(t, "kvrouter_errors_total", "code", "invalid_json"); got != 3 {
		t.Errorf("kvrouter_errors_total{code=invalid_json} = %v, want 3", got)
	}
	if ex := f.do(t, ok); ex.immediate != nil || ex.status != 200 {
		t.Errorf("after the errors: immediate %v, status %d; want routed", ex.immediate, ex.status)
	}
	if got := f.metric(t, "kvrouter_epp_streams"); got != 0 {
		t.Errorf("kvrouter_epp_streams = %v after every stream ended, want 0", got)
	}
}

// TestBodyTimeout: a body that stops arriving gets a 408 at BodyTimeout.
func TestBodyTimeout(t *testing.T) {
	f := start(t, 1, Config{BodyTimeout: 150 * time.Millisecond}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := f.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send(t, s, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: headerMap(":method", "POST", ":path", "/v1/chat/completions")}}})
	send(t, s, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`{"model":`)}}})
	t0 := time.Now()
	ir := recv(t, s).GetImmediateResponse()
	if ir == nil || ir.GetStatus().GetCode() != 408 {
		t.Fatalf("got %v, want an immediate 408", ir)
	}
	if d := time.Since(t0); d > 2*time.Second {
		t.Errorf("408 after %s, want about 150ms", d)
	}
	if got := f.metric(t, "kvrouter_epp_errors_total", "code", "body_timeout"); got != 1 {
		t.Errorf("kvrouter_epp_errors_total{code=body_timeout} = %v, want 1", got)
	}
}

// TestSubset: with Envoy's subset hint the picker chooses only among the
// endpoints listed.
func TestSubset(t *testing.T) {
	f := start(t, 3, Config{}, nil)
	only := hostOf(t, f.reps[2].URL())
	for i := range 4 {
		r := chat("m", strconv.Itoa(i), words(i, 50), false)
		r.subset = []string{only, "10.255.0.1:8000"}
		if ex := f.do(t, r); ex.list != only {
			t.Errorf("request %d went to %q (immediate %v), want %s and no fallback outside the subset", i, ex.list, ex.immediate, only)
		}
	}
}

// TestProtocolError: messages out of ext_proc's order end the stream
// with a gRPC error, counted.
func TestProtocolError(t *testing.T) {
	f := start(t, 1, Config{}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := f.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send(t, s, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: headerMap(":status", "200")}}})
	if _, err := s.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Errorf("got %v, want InvalidArgument", err)
	}
	if got := f.metric(t, "kvrouter_epp_errors_total", "code", "protocol_error"); got != 1 {
		t.Errorf("kvrouter_epp_errors_total{code=protocol_error} = %v, want 1", got)
	}
}

// TestHealth: the gRPC health service reports liveness at once and
// readiness once a replica is healthy, as GIE's picker does.
func TestHealth(t *testing.T) {
	f := start(t, 1, Config{}, nil)
	hc := healthpb.NewHealthClient(f.conn)
	ctx := context.Background()
	for _, svc := range []string{HealthLiveness, HealthReadiness, extprocv3.ExternalProcessor_ServiceDesc.ServiceName} {
		wait.For(t, svc+" SERVING", func() bool {
			resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
			return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
		})
	}
}

// TestUsageTail: the usage is found at the end of a body delivered in
// chunks of any size, and is unknown without one.
func TestUsageTail(t *testing.T) {
	sse := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("y", 20000) + "\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":4,\"prompt_tokens_details\":{\"cached_tokens\":96}}}\n\ndata: [DONE]\n\n"
	for _, size := range []int{1, 7, 512, 1 << 20} {
		var u usageTail
		for b := []byte(sse); len(b) > 0; b = b[min(size, len(b)):] {
			u.write(b[:min(size, len(b))])
		}
		if got, want := u.usage(), (fleet.Usage{PromptTokens: 120, CachedTokens: 96, CompletionTokens: 4}); got != want {
			t.Errorf("chunks of %d: got %+v, want %+v", size, got, want)
		}
	}
	var u usageTail
	u.write([]byte(`{"choices":[],"usage":null}`))
	if got := u.usage(); got != fleet.NoUsage {
		t.Errorf("null usage: got %+v, want NoUsage", got)
	}
}

// TestRoutingHeadersHidden: without --client-headers the picker adds no
// X-Kvrouter-* header to the response and removes any the upstream sent;
// with it, it adds both.
func TestRoutingHeadersHidden(t *testing.T) {
	for _, show := range []bool{false, true} {
		f := start(t, 2, Config{}, func(c *proxy.Config) { c.ClientHeaders = show })
		ex := f.do(t, chat("m", "s", words(3, 50), false))
		if ex.status != 200 {
			t.Fatalf("show=%v: status %d: %s", show, ex.status, ex.respBody)
		}
		var added []string
		for k := range ex.respHeaders {
			if strings.HasPrefix(k, "x-kvrouter-") {
				added = append(added, k)
			}
		}
		removes := slices.Contains(ex.respRemove, strings.ToLower(proxy.HeaderReplica)) && slices.Contains(ex.respRemove, strings.ToLower(proxy.HeaderDecision))
		switch {
		case !show && (len(added) > 0 || !removes):
			t.Errorf("hidden: picker sets %v and removes %v; want none set, both removed", added, ex.respRemove)
		case show && len(added) != 2:
			t.Errorf("shown: picker sets %v, want both routing headers", added)
		}
	}
}

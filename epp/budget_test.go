package epp

import (
	"context"
	"strconv"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/proxy"
)

// openBody opens a stream, sends request headers (declaring length when
// it is positive) and a first body chunk of n bytes without its end, and
// returns the stream and a cancel that ends it.
func openBody(t *testing.T, f *fixture, length, n int) (extprocv3.ExternalProcessor_ProcessClient, context.CancelFunc) {
	t.Helper()
	var hdrs []string
	if length > 0 {
		hdrs = []string{"content-length", strconv.Itoa(length)}
	}
	return openRequest(t, f, make([]byte, n), false, hdrs...)
}

// openRequest opens a stream and sends a chat completion's request
// headers (with headers, key and value pairs) and body, ending the
// request when end is set; it returns the stream and a cancel that ends
// it.
func openRequest(t *testing.T, f *fixture, body []byte, end bool, headers ...string) (extprocv3.ExternalProcessor_ProcessClient, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := f.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hdrs := append([]string{":method", "POST", ":path", "/v1/chat/completions", "content-type", "application/json"}, headers...)
	send(t, s, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: headerMap(hdrs...)}}})
	send(t, s, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: end}}})
	return s, cancel
}

// TestBodyBudget: two streams that each declare a 1 MiB body, send all
// but its last byte and stall hold the whole 2 MiB budget; a third
// declaring one is answered 503 body_budget_exhausted with Retry-After at
// its headers, and a fourth of unknown length at its first chunk, both
// counted. When the stalled streams end, their bytes are given back.
func TestBodyBudget(t *testing.T) {
	const mib = 1 << 20
	f := start(t, 1, Config{}, func(c *proxy.Config) { c.MaxBodyBytes, c.MaxBodyBytesTotal = mib, 2*mib })
	budget := f.rt.BodyBudget()
	var cancels []context.CancelFunc
	for range 2 {
		_, cancel := openBody(t, f, mib, mib-1)
		cancels = append(cancels, cancel)
	}
	wait.For(t, "the two stalled bodies held", func() bool { return budget.Held() == 2*mib })
	for _, length := range []int{mib, 0} {
		s, _ := openBody(t, f, length, 1000)
		ir := recv(t, s).GetImmediateResponse()
		if ir.GetStatus().GetCode() != 503 || !hasHeader(ir, "retry-after", "1") {
			t.Errorf("declared length %d past the budget: got %v, want an immediate 503 with Retry-After 1", length, ir)
		}
	}
	if got := budget.Held(); got != 2*mib {
		t.Errorf("held %d bytes, want the bound %d", got, 2*mib)
	}
	if got := f.metric(t, "kvrouter_epp_errors_total", "code", codeBodyBudget); got != 2 {
		t.Errorf("kvrouter_epp_errors_total{code=%s} = %v, want 2", codeBodyBudget, got)
	}
	if got := f.metric(t, "kvrouter_body_budget_refused_total"); got != 2 {
		t.Errorf("kvrouter_body_budget_refused_total = %v, want 2", got)
	}
	for _, cancel := range cancels {
		cancel()
	}
	wait.For(t, "the stalled bodies given back", func() bool { return budget.Held() == 0 })
}

// hasHeader reports whether an immediate response sets key to value.
func hasHeader(ir *extprocv3.ImmediateResponse, key, value string) bool {
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == key && string(h.GetHeader().GetRawValue()) == value {
			return true
		}
	}
	return false
}

package epp

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/proxy"
)

// routeRaw opens a stream and sends a whole chat request with headers
// (key, value pairs) in full-duplex mode, and returns the stream and the
// picker's first answer.
func routeRaw(t *testing.T, f *fixture, headers ...string) (extprocv3.ExternalProcessor_ProcessClient, *extprocv3.ProcessingResponse) {
	t.Helper()
	s, _ := openRequest(t, f, chat("m", "s", "hello", false).chunks[0], true, headers...)
	return s, recv(t, s)
}

// TestAPIKeys: with --api-keys the picker answers a request without a
// key, or with a wrong one, 401 invalid_api_key at its headers, as serve
// does, and routes one with a valid key, telling Envoy to drop its
// Authorization header.
func TestAPIKeys(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keys, []byte("sk-good team-a\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := start(t, 1, Config{}, func(c *proxy.Config) { c.APIKeys = keys })
	for _, hdr := range [][]string{nil, {"authorization", "Bearer sk-bad"}} {
		_, first := routeRaw(t, f, hdr...)
		ir := first.GetImmediateResponse()
		if ir.GetStatus().GetCode() != 401 || !strings.Contains(string(ir.GetBody()), `"invalid_api_key"`) {
			t.Errorf("key header %q: got %v, want an immediate 401 invalid_api_key", hdr, first)
		}
	}
	_, first := routeRaw(t, f, "authorization", "Bearer sk-good")
	mut := first.GetRequestHeaders().GetResponse().GetHeaderMutation()
	if mut == nil || !slices.Contains(mut.GetRemoveHeaders(), "authorization") {
		t.Errorf("a valid key: got %v, want the routing answer removing authorization", first)
	}
	if got := f.metric(t, "kvrouter_errors_total", "code", "invalid_api_key"); got != 2 {
		t.Errorf("kvrouter_errors_total{code=invalid_api_key} = %v, want 2", got)
	}
}

// TestSilentStreamReleased: a routed stream that then says nothing (no
// response headers ever) is ended after the router's --ttft-timeout, as
// serve gives up on a replica that does not start answering, and the
// replica's load is released: silent streams cannot hold the fleet
// saturated for the picker's idle timeout (10 minutes).
func TestSilentStreamReleased(t *testing.T) {
	// 300 ms: the bound under test, short for the test's sake.
	f := start(t, 1, Config{}, func(c *proxy.Config) { c.TTFTTimeout = 300 * time.Millisecond })
	s, _ := routeRaw(t, f)
	recv(t, s) // the body's answer: routed
	inflight := func() int {
		n := 0
		for _, r := range f.rt.View(time.Now()).Replicas {
			n += r.InFlight
		}
		return n
	}
	if got := inflight(); got != 1 {
		t.Fatalf("in flight after routing: %d, want 1", got)
	}
	_, err := s.Recv()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("silent stream: got %v, want DeadlineExceeded", err)
	}
	wait.For(t, "the silent stream's load released", func() bool { return inflight() == 0 })
	if got := f.metric(t, "kvrouter_epp_errors_total", "code", "ttft_timeout"); got != 1 {
		t.Errorf("kvrouter_epp_errors_total{code=ttft_timeout} = %v, want 1", got)
	}
}

package main

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/internal/wait"
)

func TestSplitEPPFlags(t *testing.T) {
	f, rest, err := splitEPPFlags([]string{"--backend", "http://a:1", "--body-mode=buffered", "-epp-idle-timeout", "3s", "--listen", ":1"})
	if err != nil {
		t.Fatal(err)
	}
	if f.bodyMode != epp.Buffered || f.idleTimeout != 3*time.Second || !slices.Equal(rest, []string{"--backend", "http://a:1", "--listen", ":1"}) {
		t.Errorf("got %+v, rest %v", f, rest)
	}
	f, rest, err = splitEPPFlags([]string{"--pool-name", "vllm", "--pool-namespace=llm", "--leader-elect", "--fallbacks", "0", "--lease-name", "l", "--policy", "kv-aware"})
	if err != nil {
		t.Fatal(err)
	}
	if !f.leaderElect || f.fallbacks != 0 || f.leaseName != "l" || !slices.Equal(rest, []string{"--policy", "kv-aware", "--discover", "inferencepool://llm/vllm"}) {
		t.Errorf("pool flags: got %+v, rest %v", f, rest)
	}
	if f, _, err := splitEPPFlags([]string{"--leader-elect=false", "--fallbacks=3"}); err != nil || f.leaderElect || f.fallbacks != 3 {
		t.Errorf("--leader-elect=false --fallbacks=3: got %+v, %v", f, err)
	}
	// GIE's picker's spellings.
	if f, _, err := splitEPPFlags([]string{"--ha-enable-leader-election", "--pool-group", "inference.networking.k8s.io"}); err != nil || !f.leaderElect {
		t.Errorf("--ha-enable-leader-election --pool-group: got %+v, %v", f, err)
	}
	for _, bad := range [][]string{{"--body-mode", "streamed-ish"}, {"--epp-idle-timeout"}, {"--epp-idle-timeout=soon"},
		{"--pool-namespace", "llm"}, {"--pool-name", "p", "--discover", "dns://x:1"}, {"--fallbacks", "-1"}, {"--leader-elect=maybe"},
		{"--pool-group", "inference.networking.x-k8s.io"}} {
		if _, _, err := splitEPPFlags(bad); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

// freeAddr returns a loopback address nothing listens on (now).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// pickOnce sends one completion's headers and body to the picker on conn
// and returns the destination it names.
func pickOnce(t *testing.T, ctx context.Context, conn *grpc.ClientConn) string {
	t.Helper()
	s, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.CloseSend()
	hdr := func(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, RawValue: []byte(v)} }
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{hdr(":method", "POST"), hdr(":path", "/v1/completions")}}}}})
	s.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
		Body: []byte(`{"model":"m","prompt":"hello","max_tokens":2}`), EndOfStream: true}}})
	resp, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range resp.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == epp.DefaultHeader {
			return string(h.GetHeader().GetRawValue())
		}
	}
	t.Errorf("no destination in the answer %v", resp)
	return ""
}

// TestRunEPP: `kvrouter epp` serves ext_proc and gRPC health on --listen
// over the backends of the serve flags, routes a request to its engine,
// and stops cleanly when its context ends.
func TestRunEPP(t *testing.T) {
	eng, err := emulator.Start(emulator.Config{Model: "m", TimeScale: 0.01}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runEPP(ctx, []string{"--listen", addr, "--admin-listen", "", "--backend", eng.URL(), "--health-interval", "50ms", "--log-level", "error"})
	}()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	wait.For(t, "readiness SERVING", func() bool {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: epp.HealthReadiness})
		return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})
	if got, want := pickOnce(t, ctx, conn), eng.URL()[len("http://"):]; got != want {
		t.Errorf("picked %q, want the engine %s", got, want)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("runEPP: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("runEPP did not stop")
	}
}

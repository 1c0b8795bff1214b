package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
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
	"github.com/kvrouter/kvrouter/proxy"
)

// loadEPP is runEPP's configuration of args, env and the YAML file
// yaml (none when empty): epp's own flags and serve's.
func loadEPP(t *testing.T, args []string, env map[string]string, yaml string) (eppFlags, proxy.Config, error) {
	t.Helper()
	if yaml != "" {
		file := filepath.Join(t.TempDir(), "epp.yaml")
		if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append([]string{"--config", file}, args...)
	}
	var ef eppFlags
	cfg, err := loadConfig("epp", eppHelp, args, func(k string) string { return env[k] }, io.Discard, &ef)
	return ef, cfg, err
}

// TestEPPFlags: epp's own flags are flags of its FlagSet, each also a
// KVROUTER_* variable and a key of the --config file, with serve's
// precedence (flags > environment > file > defaults); the pool becomes
// the discovery; GIE's picker's spellings are accepted.
func TestEPPFlags(t *testing.T) {
	ef, cfg, err := loadEPP(t, []string{"--backend", "http://a:1", "--body-mode=buffered", "-epp-idle-timeout", "3s", "--listen", ":1"}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if ef.bodyMode != epp.Buffered || ef.idleTimeout != 3*time.Second || cfg.Listen != ":1" || len(cfg.Backends) != 1 {
		t.Errorf("flags: got %+v, listen %q, backends %v", ef, cfg.Listen, cfg.Backends)
	}
	ef, cfg, err = loadEPP(t, []string{"--pool-name", "vllm", "--pool-namespace=llm", "--leader-elect", "--fallbacks", "0", "--lease-name", "l", "--policy", "kv-aware"}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if !ef.leaderElect || ef.fallbacks != 0 || ef.leaseName != "l" || cfg.Discover != "inferencepool://llm/vllm" || cfg.Policy != "kv-aware" {
		t.Errorf("pool flags: got %+v, discover %q, policy %q", ef, cfg.Discover, cfg.Policy)
	}
	if ef, _, err := loadEPP(t, []string{"--backend", "http://a:1", "--ha-enable-leader-election", "--pool-group", "inference.networking.k8s.io"}, nil, ""); err != nil || !ef.leaderElect {
		t.Errorf("GIE's --ha-enable-leader-election --pool-group: got %+v, %v", ef, err)
	}

	// The three layers: the file sets four, the environment overrides
	// two of them, a flag one of those.
	file := "backend: [\"http://file:1\"]\nfallbacks: 1\nbody-mode: buffered\nlease-name: file\npolicy: round-robin\nepp-idle-timeout: 1m\n"
	env := map[string]string{"KVROUTER_FALLBACKS": "2", "KVROUTER_LEASE_NAME": "env", "KVROUTER_POOL_NAMESPACE": "llm", "KVROUTER_POOL_NAME": "vllm"}
	ef, cfg, err = loadEPP(t, []string{"--fallbacks", "3"}, env, file)
	if err != nil {
		t.Fatal(err)
	}
	want := eppFlags{bodyMode: epp.Buffered, idleTimeout: time.Minute, fallbacks: 3, poolName: "vllm", poolNamespace: "llm", leaseName: "env"}
	if ef != want || cfg.Policy != "round-robin" || cfg.Discover != "inferencepool://llm/vllm" {
		t.Errorf("layers: got %+v, policy %q, discover %q; want %+v, round-robin and the pool", ef, cfg.Policy, cfg.Discover, want)
	}

	for _, bad := range []struct {
		args []string
		env  map[string]string
		yaml string
		want string
	}{
		{args: []string{"--body-mode", "streamed-ish"}, want: "unknown body mode"},
		{args: []string{"--epp-idle-timeout"}, want: "needs an argument"},
		{args: []string{"--epp-idle-timeout=soon"}, want: "invalid value"},
		{args: []string{"--pool-namespace", "llm"}, want: "--pool-namespace needs --pool-name"},
		{args: []string{"--pool-name", "p", "--discover", "dns://x:1"}, want: "give one"},
		{args: []string{"--fallbacks", "-1"}, want: "must not be negative"},
		{args: []string{"--leader-elect=maybe"}, want: "invalid boolean"},
		{args: []string{"--pool-group", "inference.networking.x-k8s.io"}, want: "only inference.networking.k8s.io"},
		{env: map[string]string{"KVROUTER_FALLBACKS": "-2"}, want: "KVROUTER_FALLBACKS"},
		{yaml: "backend: [\"http://a:1\"]\nfallback: 2\n", want: `line 2: unknown key "fallback" (did you mean fallbacks?)`},
		{yaml: "backend: [\"http://a:1\"]\nbody-mode: [buffered]\n", want: "body-mode takes one value"},
		{yaml: "backend: [\"http://a:1\"]\nbody-mode: sideways\n", want: "unknown body mode"},
	} {
		args := append([]string{"--backend", "http://a:1"}, bad.args...)
		if bad.yaml != "" {
			args = nil
		}
		if _, _, err := loadEPP(t, args, bad.env, bad.yaml); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%v %v %q: error %v, want one saying %q", bad.args, bad.env, bad.yaml, err, bad.want)
		}
	}
}

// TestEPPHelp: kvrouter epp -h lists epp's own flags, with their help,
// before those it shares with serve.
func TestEPPHelp(t *testing.T) {
	var out strings.Builder
	var ef eppFlags
	if _, err := loadConfig("epp", eppHelp, []string{"-h"}, func(string) string { return "" }, &out, &ef); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v, want flag.ErrHelp", err)
	}
	own, shared, ok := strings.Cut(out.String(), "flags shared with serve:")
	if !ok || !strings.Contains(own, "flags of epp:") {
		t.Fatalf("-h printed %q: want epp's flags, then serve's", out.String())
	}
	for _, name := range []string{"body-mode", "epp-idle-timeout", "fallbacks", "pool-name", "pool-namespace", "pool-group", "leader-elect", "lease-name"} {
		listed := func(s string) bool {
			return strings.Contains(s, "\n  -"+name+" ") || strings.Contains(s, "\n  -"+name+"\n")
		}
		if !listed(own) || listed(shared) {
			t.Errorf("-%s: not among epp's own flags in -h", name)
		}
	}
	if !strings.Contains(shared, "\n  -policy string") {
		t.Errorf("-h lacks serve's --policy among the shared flags")
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

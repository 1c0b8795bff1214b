package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/internal/kubeapi"
	"github.com/kvrouter/kvrouter/internal/wait"
)

// TestEPPLeaderElection runs two `kvrouter epp --pool-name ...
// --leader-elect` against a loopback Kubernetes API (internal/kubeapi):
// both follow the InferencePool's pod (the follower routes to it too),
// only the Lease's holder reports ready (gRPC health and the admin
// listener's /readyz alike), and when the leader stops (releasing the lease) the follower
// becomes ready within a retry period.
func TestEPPLeaderElection(t *testing.T) {
	if testing.Short() {
		t.Skip("a leader hand-over takes up to a retry period (2 s)")
	}
	eng, err := emulator.Start(emulator.Config{Model: "m", TimeScale: 0.01}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	port, _ := strconv.Atoi(eng.URL()[strings.LastIndexByte(eng.URL(), ':')+1:])
	api := kubeapi.New()
	ks := httptest.NewServer(api)
	defer ks.Close()
	api.Put(kubeapi.PodsPath("llm"), kubeapi.Pod("vllm-0", "127.0.0.1", true, map[string]string{"app": "vllm"}))
	api.Put(kubeapi.PoolsPath("llm"), kubeapi.Pool("vllm", map[string]string{"app": "vllm"}, port))

	type picker struct {
		addr   string
		admin  string // the admin listener's URL
		cancel context.CancelFunc
		done   chan error
		conn   *grpc.ClientConn
		hc     healthpb.HealthClient
	}
	start := func() *picker {
		p := &picker{addr: freeAddr(t), done: make(chan error, 1)}
		adminAddr := freeAddr(t)
		p.admin = "http://" + adminAddr
		ctx, cancel := context.WithCancel(context.Background())
		p.cancel = cancel
		go func() {
			p.done <- runEPP(ctx, []string{"--listen", p.addr, "--admin-listen", adminAddr, "--pool-name", "vllm", "--pool-namespace", "llm",
				"--kube-api", ks.URL, "--leader-elect", "--health-interval", "50ms", "--log-level", "error"})
		}()
		conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		p.conn, p.hc = conn, healthpb.NewHealthClient(conn)
		return p
	}
	check := func(p *picker, svc string) healthpb.HealthCheckResponse_ServingStatus {
		resp, err := p.hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			return healthpb.HealthCheckResponse_UNKNOWN
		}
		return resp.GetStatus()
	}
	readyz := func(p *picker) int { // the admin listener's /readyz status, 0 when unreachable
		resp, err := http.Get(p.admin + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	stop := func(p *picker) {
		p.cancel()
		select {
		case err := <-p.done:
			if err != nil {
				t.Errorf("runEPP: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("runEPP did not stop")
		}
	}

	a := start()
	wait.For(t, "a ready: leader, the pool's pod healthy", func() bool { return check(a, epp.HealthReadiness) == healthpb.HealthCheckResponse_SERVING })
	b := start()
	defer stop(b)
	wait.For(t, "b alive", func() bool { return check(b, epp.HealthLiveness) == healthpb.HealthCheckResponse_SERVING })
	for range 20 { // 1 s: b's discovery and health have run, and it still follows
		if got := check(b, epp.HealthReadiness); got != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Fatalf("follower b readiness %v, want NOT_SERVING", got)
		}
		if got := check(a, epp.HealthReadiness); got != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("leader a readiness %v, want SERVING", got)
		}
		if ra, rb := readyz(a), readyz(b); ra != http.StatusOK || rb != http.StatusServiceUnavailable {
			t.Fatalf("admin /readyz: leader a %d, follower b %d; want 200 and 503", ra, rb)
		}
		time.Sleep(50 * time.Millisecond) // b keeps following through the second: the behaviour under test
	}
	// The follower's state is warm: it found the pool's pod and routes
	// what reaches it.
	if got, want := pickOnce(t, context.Background(), b.conn), eng.URL()[len("http://"):]; got != want {
		t.Errorf("follower b picked %q, want the pool's pod %s", got, want)
	}
	holder := func() string {
		spec, _ := api.Get(kubeapi.LeasesPath("llm"), "kvrouter-epp-vllm")["spec"].(map[string]any)
		h, _ := spec["holderIdentity"].(string)
		return h
	}
	first := holder()
	if first == "" {
		t.Fatal("no holder in the Lease kvrouter-epp-vllm")
	}
	stop(a)
	wait.For(t, "b ready after the leader stopped", func() bool { return check(b, epp.HealthReadiness) == healthpb.HealthCheckResponse_SERVING })
	wait.For(t, "b's admin /readyz 200 after the hand-over", func() bool { return readyz(b) == http.StatusOK })
	if h := holder(); h == first || h == "" {
		t.Errorf("lease holder %q after the hand-over, want b (not %q)", h, first)
	}
}

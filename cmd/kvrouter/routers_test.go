package main

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/internal/redisserver"
	"github.com/kvrouter/kvrouter/internal/wait"
)

// serveEnv makes the test binary run `kvrouter serve` with its arguments
// (TestMain), so that a test can start routers as real processes and kill
// them with SIGKILL.
const serveEnv = "KVROUTER_TEST_SERVE"

// routerProc is one `kvrouter serve` process.
type routerProc struct {
	cmd         *exec.Cmd
	api, admin  string // base URLs
	killed      bool
	killedMutex sync.Mutex
}

func startRouterProc(t *testing.T, id, redisURL string, backends []string) *routerProc {
	t.Helper()
	api, admin := freeAddr(t), freeAddr(t)
	args := []string{"--listen", api, "--admin-listen", admin, "--redis", redisURL, "--router-id", id,
		"--sync-interval", "20ms", "--shared-ttl", "500ms", "--policy", "least-loaded", "--log-level", "warn"}
	for _, b := range backends {
		args = append(args, "--backend", b)
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), serveEnv+"=1")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &routerProc{cmd: cmd, api: "http://" + api, admin: "http://" + admin}
	t.Cleanup(func() { p.kill() })
	wait.Within(t, 20*time.Second, "router "+id+" ready", func() bool {
		resp, err := http.Get(p.api + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

func (p *routerProc) kill() {
	p.killedMutex.Lock()
	defer p.killedMutex.Unlock()
	if !p.killed {
		p.cmd.Process.Signal(syscall.SIGKILL)
		p.cmd.Wait()
		p.killed = true
	}
}

// gauge sums the samples of a metric on the router's admin /metrics
// (plain text: name{labels} value).
func (p *routerProc) gauge(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get(p.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// TestKilledRouterLoadExpires: three router processes share state through
// a real Redis; one holding requests in flight is killed with SIGKILL (no
// goodbye), and the others stop counting its load, seeing one peer fewer:
// its load key expired, as Redis says it would, within --shared-ttl
// 500ms of its last round. How soon after the kill the others see it is
// logged, not asserted: it is the TTL and then their next rounds, which
// a loaded machine delays by as much as it likes.
func TestKilledRouterLoadExpires(t *testing.T) {
	if testing.Short() {
		t.Skip("starts router processes")
	}
	rs := redisserver.Start(t)
	var backends []string
	for range 2 {
		e, err := emulator.Start(emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: 1}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		backends = append(backends, e.URL())
	}
	ps := make([]*routerProc, 3)
	for i := range ps {
		ps[i] = startRouterProc(t, fmt.Sprint("r", i), rs.URL(), backends)
	}
	wait.For(t, "every router sees 2 peers", func() bool {
		return ps[0].gauge(t, "kvrouter_shared_state_peers") == 2 && ps[1].gauge(t, "kvrouter_shared_state_peers") == 2 &&
			ps[2].gauge(t, "kvrouter_shared_state_peers") == 2
	})
	// Router 2 takes 4 long requests (streams of 2,000 tokens at the
	// preset's speed: tens of seconds); they end when it dies.
	for i := range 4 {
		go func() {
			body := fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":2000,"messages":[{"role":"user","content":"long %d"}]}`, i)
			resp, err := http.Post(ps[2].api+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err == nil {
				defer resp.Body.Close()
				bufio.NewReader(resp.Body).ReadString(0)
			}
		}()
	}
	wait.For(t, "routers 0 and 1 see router 2's 4 requests", func() bool {
		return ps[0].gauge(t, "kvrouter_peer_inflight") == 4 && ps[1].gauge(t, "kvrouter_peer_inflight") == 4
	})
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rc.Close()
	var ttl time.Duration
	wait.For(t, "router 2's load key in Redis", func() bool { // a round late past the TTL lets it lapse for a while
		ttl, _ = rc.PTTL(context.Background(), "kvrouter:load:r2").Result()
		return ttl > 0
	})
	if ttl > 500*time.Millisecond {
		t.Errorf("router 2's load key expires in %v, want within --shared-ttl 500ms", ttl)
	}
	ps[2].kill()
	killed := time.Now()
	wait.For(t, "router 2's load leaves the others' view", func() bool {
		return ps[0].gauge(t, "kvrouter_peer_inflight") == 0 && ps[1].gauge(t, "kvrouter_peer_inflight") == 0
	})
	t.Logf("a SIGKILLed router's load left the others' view after %v (--shared-ttl 500ms, --sync-interval 20ms)", time.Since(killed))
	if n, err := rc.Exists(context.Background(), "kvrouter:load:r2").Result(); err != nil || n != 0 {
		t.Errorf("router 2's load key still in Redis after its load left the others' view (%d, %v)", n, err)
	}
	if n := ps[0].gauge(t, "kvrouter_shared_state_peers"); n != 1 {
		t.Errorf("router 0 sees %v peers after the kill, want 1", n)
	}
}

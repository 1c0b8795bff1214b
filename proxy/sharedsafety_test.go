package proxy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvrouter/kvrouter/internal/redisserver"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/peers"
)

// writeKey writes a fleet secret to a file and returns its path.
func writeKey(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "redis.key")
	if err := os.WriteFile(p, []byte("3f1c0e9a7b2d4c6e8f0a1b3c5d7e9f10\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// forgeMember does what the attacker did with write access to
// Redis: HSET kvrouter:members URL '{"url":URL,"state":"serving"}' and
// INCR kvrouter:members:version.
func forgeMember(t *testing.T, addr, url string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	ctx := context.Background()
	if err := c.HSet(ctx, "kvrouter:members", url, fmt.Sprintf(`{"url":%q,"state":"serving"}`, url)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Incr(ctx, "kvrouter:members:version").Err(); err != nil {
		t.Fatal(err)
	}
}

// TestForgedMember: the reproduction. Without --redis-key-file a
// member forged in Redis becomes a backend of the router, as before; with
// it, the forged member is ignored (counted in
// kvrouter_shared_state_rejected_total{kind="member"}) and none of 60
// requests reaches the forged backend, while a backend added through
// another keyed router's admin API is followed.
func TestForgedMember(t *testing.T) {
	rs := redisserver.Start(t)
	reps := replicas(t, 2, 0.01)
	// A working backend: only the routing keeps it out. Its completions
	// are counted from the keyed phase on.
	fake := newFake(t, 0)
	var completions atomic.Int64
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			completions.Add(1)
		}
		fake.serve(w, r)
	}))
	t.Cleanup(evil.Close)
	const interval = 20 * time.Millisecond

	open, _ := startRouter(t, "least-loaded", func(c *Config) {
		c.Peers = peers.Settings{URL: rs.URL(), Interval: interval, TTL: time.Second, Router: "open"}
	}, reps[0].URL())
	runRouter(t, open)
	forgeMember(t, rs.Addr, evil.URL)
	wait.For(t, "the router without a secret follows the forged member", func() bool { return backendStates(open)[evil.URL] == "serving" })

	rs.Restart() // empty again
	key := writeKey(t)
	keyed := func(name string) (*Router, string) {
		rt, u := startRouter(t, "least-loaded", func(c *Config) {
			c.Peers = peers.Settings{URL: rs.URL(), Interval: interval, TTL: time.Second, Router: name, KeyFile: key}
		}, reps[0].URL())
		runRouter(t, rt)
		return rt, u
	}
	a, au := keyed("a")
	b, _ := keyed("b")
	wait.For(t, "both keyed routers up", func() bool { return a.Shared().Up() && b.Shared().Up() })
	forgeMember(t, rs.Addr, evil.URL)
	seen := completions.Load()
	if err := b.AddBackend(Backend{URL: reps[1].URL(), Models: []string{"m"}}, "admin"); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "a follows the backend added on b", func() bool { return backendStates(a)[reps[1].URL()] == "serving" })
	wait.For(t, "the forged member counted", func() bool {
		return metricValue(t, au, "kvrouter_shared_state_rejected_total", "kind", "member") > 0
	})
	if s, ok := backendStates(a)[evil.URL]; ok {
		t.Fatalf("a lists the forged backend (%s)", s)
	}
	for i := range 60 {
		resp, body := do(t, "POST", au+"/v1/chat/completions",
			fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"max_tokens":2}`, words(i, 20)))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, body)
		}
	}
	if n := completions.Load() - seen; n != 0 {
		t.Errorf("the forged backend received %d requests, want 0", n)
	}
}

// TestStalledRedisRequest: with Redis stopped (SIGSTOP), a request with a
// session is answered while its binding's write is still pending (no
// write result counted yet): it waited at most --shared-read-timeout for
// the read and as long for the write, not the syncer's timeout (4 s here).
// Once Redis resumes, the write lands.
func TestStalledRedisRequest(t *testing.T) {
	rs := redisserver.Start(t)
	reps := replicas(t, 2, 0.01)
	rt, u := startRouter(t, "kv-aware", func(c *Config) {
		// A 2 s interval makes the syncer's timeout 4 s (2 intervals).
		c.Peers = peers.Settings{URL: rs.URL(), Interval: 2 * time.Second, TTL: 40 * time.Second, Router: "a", KeyFile: writeKey(t)}
	}, urls(reps)...)
	runRouter(t, rt)
	wait.For(t, "shared state up", func() bool { return rt.Shared().Up() })
	writes := func() float64 {
		var n float64
		for _, r := range []string{"ok", "error", "dropped"} {
			n += metricValue(t, u, "kvrouter_shared_session_writes_total", "result", r)
		}
		return n
	}
	body := `{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":2}`
	start := time.Now()
	do(t, "POST", u+"/v1/chat/completions", body, "X-Session-ID", "running")
	took := time.Since(start)
	wait.For(t, "the first binding written", func() bool { return writes() == 1 })
	before := writes()
	timeouts := metricValue(t, u, "kvrouter_shared_session_reads_total", "result", "timeout")
	rs.Stop()
	defer rs.Continue()
	start = time.Now()
	resp, out := do(t, "POST", u+"/v1/chat/completions", body, "X-Session-ID", "stalled")
	t.Logf("a request with a session took %v with Redis running, %v with it stopped (--shared-read-timeout 5ms; the syncer's timeout 4s)",
		took.Round(100*time.Microsecond), time.Since(start).Round(100*time.Microsecond))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	if n := writes(); n != before {
		t.Errorf("%v write results counted when the answer ended, want %v: the request waited for the write", n, before)
	}
	if n := metricValue(t, u, "kvrouter_shared_session_reads_total", "result", "timeout") - timeouts; n != 1 {
		t.Errorf("%v more reads{result=timeout}, want 1: the stopped read", n)
	}
	rs.Continue()
	wait.For(t, "the binding lands once Redis resumes", func() bool {
		return metricValue(t, u, "kvrouter_shared_session_writes_total", "result", "ok") > 0
	})
}

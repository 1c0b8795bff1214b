package proxy

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/wait"
)

// slowHealth fronts a replica whose /health takes 1.5 s (the issue's
// reproduction) while its completions are as fast as ever, counting the
// probes.
type slowHealth struct {
	*httptest.Server
	probes atomic.Int64
}

func newSlowHealth(t *testing.T, replica http.Handler) *slowHealth {
	t.Helper()
	s := &slowHealth{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			s.probes.Add(1)
			select {
			case <-time.After(1500 * time.Millisecond): // the slow /health under test
			case <-r.Context().Done():
			}
			return
		}
		replica.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

// slowFleet starts three emulated replicas behind slow /health routes and
// a router in front of them probing every 100 ms (so each probe times out
// at 500 ms).
func slowFleet(t *testing.T, policy string) (*Router, string, []*slowHealth) {
	t.Helper()
	reps := replicas(t, 3, 0.01)
	fronts := make([]*slowHealth, len(reps))
	var us []string
	for i, r := range reps {
		fronts[i] = newSlowHealth(t, r.Handler())
		us = append(us, fronts[i].URL)
	}
	rt, u := startRouter(t, policy, func(c *Config) { c.HealthInterval = 100 * time.Millisecond }, us...)
	runRouter(t, rt)
	return rt, u, fronts
}

// complete sends one chat completion and returns its status.
func complete(t *testing.T, u string, i int) int {
	t.Helper()
	resp, body := do(t, "POST", u+"/v1/chat/completions",
		fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"max_tokens":2}`, words(i, 12)))
	if resp.StatusCode != http.StatusOK {
		t.Logf("request %d: status %d: %s", i, resp.StatusCode, body)
	}
	return resp.StatusCode
}

// TestSlowProbesBusyFleet: the reproduction with traffic. Every
// replica's /health takes 1.5 s, past the probe timeout, while requests
// flow (round robin, so each replica has successes): until every replica
// has failed at least three probes, every request is served, no replica
// is ejected, and the probes are counted as overruled.
func TestSlowProbesBusyFleet(t *testing.T) {
	rt, u, fronts := slowFleet(t, "round-robin")
	probed := func() bool {
		for _, f := range fronts {
			if f.probes.Load() < 4 { // the fourth started: three failed
				return false
			}
		}
		return true
	}
	served, sent := 0, 0
	for ; !probed() && sent < 20000; sent++ {
		if complete(t, u, sent) == http.StatusOK {
			served++
		}
	}
	if !probed() {
		t.Fatalf("the replicas were not probed 4 times in %d requests", sent)
	}
	t.Logf("%d of %d requests served while each replica failed at least 3 probes", served, sent)
	if served != sent {
		t.Errorf("%d of %d requests served, want all", served, sent)
	}
	for _, f := range fronts {
		if !rt.st.health.Healthy(f.URL) {
			st, _ := rt.st.health.Status(f.URL)
			t.Errorf("%s ejected: %s", f.URL, st.Reason)
		}
	}
	if n := metricValue(t, u, "kvrouter_probe_overruled_total"); n < 3 {
		t.Errorf("kvrouter_probe_overruled_total = %v, want each replica's probes overruled (3)", n)
	}
}

// TestSlowProbesIdleFleet: the same fleet without traffic until probes
// have ejected every replica (the router answered 503 no_healthy_replica
// then): in panic mode, every one of 30 requests is served, each counted.
func TestSlowProbesIdleFleet(t *testing.T) {
	rt, u, fronts := slowFleet(t, "kv-aware")
	wait.For(t, "probes eject every replica", func() bool {
		for _, f := range fronts {
			if rt.st.health.Healthy(f.URL) {
				return false
			}
		}
		return true
	})
	if got := metricValue(t, u, "kvrouter_health_panic"); got != 1 {
		t.Fatalf("kvrouter_health_panic = %v, want 1", got)
	}
	const n = 30
	for i := range n {
		if code := complete(t, u, i); code != http.StatusOK {
			t.Fatalf("request %d: status %d in panic mode, want 200", i, code)
		}
	}
	if got := metricValue(t, u, "kvrouter_panic_routed_total"); got != n {
		t.Errorf("kvrouter_panic_routed_total = %v, want %d", got, n)
	}
}

// TestHoldForReplica: with its only replica gone (connection refused,
// ejected), a request is held rather than answered 503 at once, and is
// served when the replica is back on its port and readmitted;
// kvrouter_no_replica_holds_total counts it.
func TestHoldForReplica(t *testing.T) {
	reps := replicas(t, 1, 0.01)
	front := httptest.NewServer(reps[0].Handler())
	addr := front.Listener.Addr().String()
	rt, u := startRouter(t, "kv-aware", func(c *Config) {
		c.HealthInterval = 50 * time.Millisecond
		c.Outlier.EjectBase = 50 * time.Millisecond
		c.TTFTTimeout = time.Minute
	}, front.URL)
	runRouter(t, rt)
	if code := complete(t, u, 0); code != http.StatusOK {
		t.Fatalf("status %d before the replica went away", code)
	}
	front.Close()
	wait.For(t, "the replica ejected", func() bool { return !rt.st.health.Routable(front.URL) })

	done := make(chan int, 1)
	go func() {
		resp, _ := http.Post(u+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"are you back?"}],"max_tokens":2}`))
		if resp == nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	wait.For(t, "a request waiting for a replica", func() bool { return metricValue(t, u, "kvrouter_no_replica_waiting") == 1 })
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("relisten on %s: %v", addr, err)
	}
	back := &httptest.Server{Listener: ln, Config: &http.Server{Handler: reps[0].Handler()}}
	back.Start()
	defer back.Close()
	if code := <-done; code != http.StatusOK {
		t.Fatalf("held request: status %d, want 200", code)
	}
	if got := metricValue(t, u, "kvrouter_no_replica_holds_total", "result", "served"); got != 1 {
		t.Errorf("no_replica_holds{result=served} = %v, want 1", got)
	}
}

package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/demo"
	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/loadgen"
)

// TestReplayDemoAgentParallel: kvrouter replay --workload demo-chat sends
// the hot agent session's steps at their arrivals, side by side, as
// kvrouter demo and the simulator do, not one after another as a
// conversation's turns. In front of an emulated engine, a relay holds the
// agent's first step until a second one is in flight: sent one after
// another, the second never comes while the first is held.
func TestReplayDemoAgentParallel(t *testing.T) {
	eng, err := emulator.Start(emulator.Config{Model: "m", TimeScale: 0.02}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	u, err := url.Parse(eng.URL())
	if err != nil {
		t.Fatal(err)
	}
	relay := httputil.NewSingleHostReverseProxy(u)
	var (
		mu             sync.Mutex
		inflight, most int
		agentSteps     int
		overlap        = make(chan struct{})
		overlapOnce    sync.Once
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(loadgen.DefaultSessionHeader) != "agent-0" {
			relay.ServeHTTP(w, r)
			return
		}
		mu.Lock()
		inflight++
		agentSteps++
		most = max(most, inflight)
		if inflight >= 2 {
			overlapOnce.Do(func() { close(overlap) })
		}
		mu.Unlock()
		select {
		case <-overlap:
		case <-r.Context().Done():
		case <-time.After(wait.Timeout): // a bound on a hung test, not a threshold: sent in order, no second step comes
		}
		relay.ServeHTTP(w, r)
		mu.Lock()
		inflight--
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	err = runReplay(context.Background(), []string{"--target", srv.URL, "--model", "m", "--workload", demo.ChatWorkload,
		"--requests", "40", "--time-scale", "0.02", "--max-tokens", "4", "--json"})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if agentSteps < 2 || most < 2 {
		t.Errorf("the agent's %d steps: at most %d in flight at once, want its steps side by side (2 or more)", agentSteps, most)
	}
}

package sim

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/trace"
)

// TestRoutersShare: three simulated routers that exchange their shares
// every 50 ms keep kv-aware's hit rate on multi-turn chat (turns given to
// the routers in turn) close to one router's; three that never exchange
// lose it, each binding a conversation and caching its prefix on its own.
func TestRoutersShare(t *testing.T) {
	w, err := trace.Generate("multi-turn-chat", trace.GenOptions{Seed: 1, Requests: 300})
	if err != nil {
		t.Fatal(err)
	}
	hit := map[string]float64{}
	for _, c := range []struct {
		name    string
		routers int
		sync    time.Duration
	}{{"one", 1, 0}, {"three", 3, 50 * time.Millisecond}, {"three-alone", 3, -1}} {
		o, err := simulate(Config{Requests: w.Requests, Replicas: 4, Load: 0.7, Policies: []string{"kv-aware"},
			Routers: c.routers, SyncInterval: c.sync})
		if err != nil {
			t.Fatal(err)
		}
		hit[c.name] = hitRate(o.runs[0])
	}
	t.Logf("kv-aware hit rate: one router %.3f, three sharing %.3f, three alone %.3f", hit["one"], hit["three"], hit["three-alone"])
	if hit["three"] < hit["one"]-0.05 {
		t.Errorf("three routers sharing: hit rate %.3f, want within 0.05 of one router's %.3f", hit["three"], hit["one"])
	}
	if hit["three"] <= hit["three-alone"]+0.05 {
		t.Errorf("three routers sharing: hit rate %.3f not clearly above three alone %.3f", hit["three"], hit["three-alone"])
	}
}

// TestRoutersShareSessions: two simulated routers that exchange their
// shares only every 10 s, longer than a conversation, get a multi-turn
// chat's turns in turn: each reads the binding the other wrote when it
// decided, as the live routers read it from Redis, so kv-aware keeps each
// conversation on one replica and the hit rate close to one router's.
func TestRoutersShareSessions(t *testing.T) {
	w, err := trace.Generate("multi-turn-chat", trace.GenOptions{Seed: 1, Requests: 300})
	if err != nil {
		t.Fatal(err)
	}
	var hit [2]float64
	for i, n := range []int{1, 2} {
		o, err := simulate(Config{Requests: w.Requests, Replicas: 4, Load: 0.7, Policies: []string{"kv-aware"},
			Routers: n, SyncInterval: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		hit[i] = hitRate(o.runs[0])
	}
	t.Logf("kv-aware hit rate: one router %.3f, two syncing every 10 s %.3f", hit[0], hit[1])
	if hit[1] < hit[0]-0.03 {
		t.Errorf("two routers: hit rate %.3f, want within 0.03 of one router's %.3f", hit[1], hit[0])
	}
}

// TestRoutersOneIsDefault: Routers 1 runs exactly as the zero value.
func TestRoutersOneIsDefault(t *testing.T) {
	w, err := trace.Generate("hot-prefix", trace.GenOptions{Seed: 3, Requests: 120})
	if err != nil {
		t.Fatal(err)
	}
	var got [2]float64
	for i, n := range []int{0, 1} {
		o, err := simulate(Config{Requests: w.Requests, Replicas: 4, Load: 0.8, Policies: []string{"kv-aware"}, Routers: n})
		if err != nil {
			t.Fatal(err)
		}
		got[i] = hitRate(o.runs[0])
	}
	if got[0] != got[1] {
		t.Errorf("hit rate with Routers 0 %v, with 1 %v: want equal", got[0], got[1])
	}
}

func TestRoutersConfig(t *testing.T) {
	for _, c := range []Config{{Routers: -1}, {Routers: MaxRouters + 1}, {Routers: 2, Assign: "random"}} {
		c.Requests = []trace.Request{{ID: "a", Prompt: 10}}
		if _, err := simulate(c); err == nil {
			t.Errorf("simulate(Routers %d, Assign %q) accepted", c.Routers, c.Assign)
		}
	}
}

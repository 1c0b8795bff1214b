package proxy

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/redisserver"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/peers"
)

// syncEvery is the tests' --sync-interval.
const syncEvery = 20 * time.Millisecond

// startRouters starts n routers with policy in front of backends, sharing
// their state through redisURL (none when empty); it returns their URLs.
func startRouters(t *testing.T, n int, policy, redisURL string, backends ...string) ([]*Router, []string) {
	t.Helper()
	rts, us := make([]*Router, n), make([]string, n)
	for i := range n {
		rts[i], us[i] = startRouter(t, policy, func(c *Config) {
			c.Peers = peers.Settings{URL: redisURL, Interval: syncEvery, TTL: 500 * time.Millisecond, Router: fmt.Sprint("router-", i)}
		}, backends...)
		runRouter(t, rts[i])
	}
	if redisURL != "" {
		for _, rt := range rts {
			wait.For(t, fmt.Sprintf("router %s to see %d peers", rt.Shared().Router(), n-1), func() bool { return rt.Shared().Peers() == n-1 })
		}
	}
	return rts, us
}

// TestSharedConversation: a conversation whose turns alternate between 3
// routers stays on one replica when they share state through Redis.
// Without it (the control) each router binds the session on its own.
func TestSharedConversation(t *testing.T) {
	rs := redisserver.Start(t)
	reps := replicas(t, 4, 0.01)
	spread := map[string]int{}
	for _, mode := range []string{"shared", "alone"} {
		for _, s := range reps {
			s.Reset()
		}
		url := ""
		if mode == "shared" {
			url = rs.URL()
		}
		rts, us := startRouters(t, 3, "kv-aware", url, urls(reps)...)
		msgs := []chatMsg{{"system", "You are terse. " + words(7, 20)}}
		served := map[string]bool{}
		for turn := range 9 {
			msgs = append(msgs, chatMsg{"user", words(700+turn, 60)})
			b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "max_tokens": 8})
			resp, body := do(t, "POST", us[turn%3]+"/v1/chat/completions", string(b), "X-Session-ID", "conv-"+mode)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s turn %d: status %d: %s", mode, turn, resp.StatusCode, body)
			}
			var r chatResp
			if err := json.Unmarshal([]byte(body), &r); err != nil || len(r.Choices) == 0 {
				t.Fatalf("%s turn %d: %v: %s", mode, turn, err, body)
			}
			served[resp.Header.Get(HeaderReplica)] = true
			msgs = append(msgs, r.Choices[0].Message)
			// The user reads the answer: longer than the staleness bound,
			// two rounds of every router (slower than 2 intervals on a
			// loaded machine).
			twoRounds(t, rts)
		}
		spread[mode] = len(served)
		t.Logf("%s: 9 turns over 3 routers served by %d replicas", mode, len(served))
	}
	if spread["shared"] != 1 {
		t.Errorf("shared: the conversation was served by %d replicas, want 1", spread["shared"])
	}
}

// bursts sends, for each router index in order[k], one request of burst k
// at the same time; once they are routed, it waits two rounds of every
// router before the next burst. The requests are long streams, kept open
// (checked) until every burst is placed, then cancelled; it returns how
// many each replica got.
func bursts(t *testing.T, rts []*Router, us []string, order [][]int) map[string]int {
	t.Helper()
	var mu sync.Mutex
	got := map[string]int{}
	var wg, placed sync.WaitGroup
	done := make(chan struct{})
	defer func() { close(done); wg.Wait() }()
	n := 0
	sent := make([]int, len(rts))
	for _, b := range order {
		for _, ri := range b {
			n++
			sent[ri]++
			body := fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":4000,"messages":[{"role":"user","content":"burst request %d"}]}`, n)
			url := us[ri]
			placed.Add(1)
			wg.Go(func() {
				answered := false
				defer func() {
					if !answered {
						placed.Done()
					}
				}()
				resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Errorf("post: %v", err)
					return
				}
				defer resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Errorf("status %d", resp.StatusCode)
					return
				}
				mu.Lock()
				got[resp.Header.Get(HeaderReplica)]++
				mu.Unlock()
				answered = true
				placed.Done()
				<-done
			})
		}
		for i := range rts {
			wait.For(t, fmt.Sprintf("router %d to hold its %d requests in flight", i, sent[i]), func() bool { return ownInFlight(rts[i]) == sent[i] })
		}
		twoRounds(t, rts)
	}
	placed.Wait()
	mu.Lock()
	defer mu.Unlock()
	return maps.Clone(got)
}

// ownInFlight is the requests a router itself has in flight.
func ownInFlight(rt *Router) int {
	n := 0
	for i, b := range rt.st.bes.list() {
		n += inflight(rt, i) - int(rt.st.fleet.PeerLoad(b.cfg.URL).InFlight)
	}
	return n
}

// TestSharedBursts: bursts spread over 3 routers sharing state end with
// each replica's load within 10% of what one router achieves with the
// same bursts (least-loaded: the in-flight counts decide).
func TestSharedBursts(t *testing.T) {
	rs := redisserver.Start(t)
	reps := replicas(t, 4, 1)
	// Bursts of 3 requests, each burst from one router, 4 bursts: 12
	// requests in flight at the end, 3 a replica for one router.
	threeRouters := [][]int{{0, 0, 0}, {1, 1, 1}, {2, 2, 2}, {0, 0, 0}}
	oneRouter := [][]int{{0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 0}}
	ones, one := startRouters(t, 1, "least-loaded", "", urls(reps)...)
	want := bursts(t, ones, one, oneRouter)
	for _, s := range reps {
		s.Reset()
	}
	shareds, shared := startRouters(t, 3, "least-loaded", rs.URL(), urls(reps)...)
	got := bursts(t, shareds, shared, threeRouters)
	t.Logf("per-replica requests: one router %v, three sharing %v", want, got)
	for _, u := range urls(reps) {
		if w, g := float64(want[u]), float64(got[u]); g > w*1.1 || g < w*0.9 {
			t.Errorf("replica %s: %v requests with 3 routers sharing, want within 10%% of one router's %v", u, g, w)
		}
	}
}

// TestSharedRedisKilled: Redis killed with kill -9 in the middle of a run
// loses no request; the routers report kvrouter_shared_state_up 0, route
// on their own views, and rejoin (1) when Redis is back.
func TestSharedRedisKilled(t *testing.T) {
	rs := redisserver.Start(t)
	reps := replicas(t, 3, 0.01)
	rts, us := startRouters(t, 3, "kv-aware", rs.URL(), urls(reps)...)
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	stop := make(chan struct{})
	for w := range 3 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				body := fmt.Sprintf(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"worker %d request %d"}]}`, w, i)
				resp, err := http.Post(us[(w+i)%3]+"/v1/chat/completions", "application/json", strings.NewReader(body))
				code := -1
				if err == nil {
					code = resp.StatusCode
					resp.Body.Close()
				}
				mu.Lock()
				codes[code]++
				mu.Unlock()
			}
		})
	}
	// answered waits for 20 more responses than were had when it was called.
	answered := func(what string) {
		t.Helper()
		mu.Lock()
		from := codes[http.StatusOK] + codes[-1]
		mu.Unlock()
		wait.For(t, "20 responses "+what, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return codes[http.StatusOK]+codes[-1] >= from+20
		})
	}
	answered("with Redis up")
	rs.Kill()
	wait.For(t, "kvrouter_shared_state_up 0 with Redis killed", func() bool { return metricValue(t, us[0], "kvrouter_shared_state_up") == 0 })
	answered("with Redis away")
	rs.Restart()
	wait.For(t, "every router up again, seeing its two peers", func() bool {
		for _, rt := range rts {
			if !rt.Shared().Up() || rt.Shared().Peers() != 2 {
				return false
			}
		}
		return true
	})
	answered("with Redis back")
	close(stop)
	wg.Wait()
	t.Logf("responses by status: %v", codes)
	// Up and two peers once more, as events: a peer's publication is
	// fresh for the test's shared TTL (500 ms) of wall time, which a
	// loaded machine can let pass between two of its rounds, so an
	// instant's look could see a peer that is only late.
	for i := range us {
		wait.For(t, fmt.Sprintf("router %d: kvrouter_shared_state_up 1 and two peers after Redis came back", i), func() bool {
			return metricValue(t, us[i], "kvrouter_shared_state_up") == 1 && rts[i].Shared().Peers() == 2
		})
	}
	if len(codes) != 1 || codes[http.StatusOK] == 0 {
		t.Errorf("responses by status %v: want all 200", codes)
	}
}

// twoRounds waits until every router sharing state has completed two
// rounds since the call (publish, then the peers' read): the staleness
// bound of the protocol; without shared state, 4 sync intervals.
func twoRounds(t *testing.T, rts []*Router) {
	t.Helper()
	if rts[0].Shared() == nil {
		// No rounds to count: the routers alone get the same time, the
		// comparison the tests make.
		time.Sleep(4 * syncEvery)
		return
	}
	start := make([]int64, len(rts))
	for i, rt := range rts {
		start[i] = rt.Shared().Rounds()
	}
	for i, rt := range rts {
		wait.For(t, fmt.Sprintf("router %d's two rounds", i), func() bool { return rt.Shared().Rounds() >= start[i]+2 })
	}
}

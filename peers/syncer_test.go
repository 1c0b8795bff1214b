package peers

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/internal/redisserver"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/route"
)

var replicas = []fleet.Replica{{ID: "http://r0"}, {ID: "http://r1"}, {ID: "http://r2"}}

// stickyLeastLoaded keeps a session on its replica, else takes the
// fewest requests in flight (the peers' counted).
var stickyLeastLoaded = route.Func(func(r *route.Request, s *route.Snapshot) route.Decision {
	if r.Pinned >= 0 {
		return route.Decision{Replica: r.Pinned, Reason: route.ReasonSession}
	}
	return route.LeastLoaded{}.Pick(r, s)
})

func newFleet(t testing.TB) *fleet.Fleet {
	t.Helper()
	f, err := fleet.New(fleet.Config{Replicas: replicas, Policy: stickyLeastLoaded, Start: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func newSyncer(t testing.TB, url, router string, f *fleet.Fleet) *Syncer {
	t.Helper()
	s, err := New(Config{Settings: Settings{URL: url, Router: router, Interval: 20 * time.Millisecond, TTL: 400 * time.Millisecond}}, f)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// run runs s until the test ends.
func run(t *testing.T, s *Syncer) context.CancelFunc {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { s.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return cancel
}

// TestSyncerShares: through a real Redis, one router's load and session
// reach the other; a router that dies (stops refreshing, no goodbye) is
// forgotten within its TTL.
func TestSyncerShares(t *testing.T) {
	rs := redisserver.Start(t)
	fa, fb := newFleet(t), newFleet(t)
	sa, sb := newSyncer(t, rs.URL(), "a", fa), newSyncer(t, rs.URL(), "b", fb)
	run(t, sb)
	var sc fleet.Scratch
	d, tk := fa.Decide(&fleet.Request{ID: "q1", Session: "conv-1", Tokens: 100}, nil, time.Now(), &sc)
	if tk == nil {
		t.Fatalf("no ticket: %+v", d)
	}
	id := replicas[d.Replica].ID
	sa.round(context.Background()) // one round, then a "crash": a does nothing more
	if !sa.Up() {
		t.Fatal("router a's round did not reach Redis")
	}
	wait.Within(t, 2*time.Second, "b sees a's load", func() bool { return fb.PeerLoad(id).InFlight == 1 })
	if got := fb.PeerLoad(id).PrefillTokens; got != 100 {
		t.Errorf("b sees %d prefill tokens of a's on %s, want 100", got, id)
	}
	var sc2 fleet.Scratch
	d2, tk2 := fb.Decide(&fleet.Request{ID: "q2", Session: "conv-1", Tokens: 10}, nil, time.Now(), &sc2)
	if d2.Replica != d.Replica {
		t.Errorf("b routed a's session to %d (%s), want %d pinned", d2.Replica, d2.Reason, d.Replica)
	}
	tk2.Done(time.Now(), fleet.NoUsage, nil)
	if sb.Peers() != 1 {
		t.Errorf("b sees %d peers, want 1", sb.Peers())
	}
	// a is gone: within its TTL (400 ms) and a round, b stops counting it.
	took := wait.Within(t, 2*time.Second, "a's load expires", func() bool { return fb.PeerLoad(id).InFlight == 0 })
	if took > 400*time.Millisecond+400*time.Millisecond {
		t.Errorf("a's load took %v to expire, want ≤ TTL 400ms + 400ms of slack", took)
	}
	t.Logf("a dead router's load left b's view after %v (TTL 400ms)", took)
	tk.Done(time.Now(), fleet.NoUsage, nil)
}

// TestSyncerDegraded: with Redis killed (kill -9), the syncer reports down
// and the fleet keeps deciding; when Redis is back, both routers rejoin
// and share again, including the sessions bound meanwhile.
func TestSyncerDegraded(t *testing.T) {
	rs := redisserver.Start(t)
	fa, fb := newFleet(t), newFleet(t)
	sa, sb := newSyncer(t, rs.URL(), "a", fa), newSyncer(t, rs.URL(), "b", fb)
	run(t, sa)
	run(t, sb)
	wait.Within(t, 2*time.Second, "both up", func() bool { return sa.Up() && sb.Up() })
	rs.Kill()
	wait.Within(t, 2*time.Second, "both down", func() bool { return !sa.Up() && !sb.Up() })
	var sc fleet.Scratch
	start := time.Now()
	d, tk := fa.Decide(&fleet.Request{ID: "q1", Session: "during-outage", Tokens: 100}, nil, time.Now(), &sc)
	if tk == nil || time.Since(start) > 10*time.Millisecond {
		t.Fatalf("decision with Redis down: %+v in %v", d, time.Since(start))
	}
	rs.Restart()
	wait.Within(t, 3*time.Second, "both up again", func() bool { return sa.Up() && sb.Up() })
	id := replicas[d.Replica].ID
	wait.Within(t, 2*time.Second, "b sees a's load after the restart", func() bool { return fb.PeerLoad(id).InFlight == 1 })
	// The binding comes through the stream, the load through a's key: a
	// round of b's can read the one before a's round wrote the other.
	wait.Within(t, 2*time.Second, "b sees the session a bound during the outage", func() bool { return fb.Sessions() == 1 })
	var sc2 fleet.Scratch
	if d2, tk2 := fb.Decide(&fleet.Request{ID: "q2", Session: "during-outage", Tokens: 10}, nil, time.Now(), &sc2); d2.Replica != d.Replica {
		t.Errorf("b routed the session bound during the outage to %d, want %d", d2.Replica, d.Replica)
	} else {
		tk2.Done(time.Now(), fleet.NoUsage, nil)
	}
	tk.Done(time.Now(), fleet.NoUsage, nil)
}

func TestNewRejects(t *testing.T) {
	f := newFleet(t)
	for _, c := range []Settings{
		{URL: "http://x"},
		{URL: "redis://127.0.0.1:1", Interval: -1},
		{URL: "redis://127.0.0.1:1", Interval: time.Second, TTL: time.Second},
		{URL: "redis://127.0.0.1:1", Router: "a b"},
	} {
		if _, err := New(Config{Settings: c}, f); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
}

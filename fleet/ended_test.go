package fleet

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
)

// TestPeerTurnEnded: router one routes a session's turn and exports its
// share while the turn is in flight; the turn ends, and its session's
// next turn reaches router two, which reads one's binding (BindPeer)
// before one's next share: two no longer counts the ended turn on its
// replica, however long one's old share stays; a share one exported
// since counts what it counts; a turn of another prompt proves nothing.
func TestPeerTurnEnded(t *testing.T) {
	one := newFleet(t, Config{Policy: route.LeastLoaded{}})
	two := newFleet(t, Config{Policy: route.LeastLoaded{}})
	one.SharePeers(0)
	chain := []residency.Chain{{Tokens: 16, Hashes: []prefix.Hash{11, 12, 13, 14}}}
	var sc Scratch
	d, tk := one.Decide(&Request{ID: "t1", Session: "agent", Tokens: 64, MaxTokens: 10, Chains: chain}, nil, t0, &sc)
	if tk == nil {
		t.Fatalf("no ticket: %+v", d)
	}
	sh := one.Export(t0.Add(10 * time.Millisecond)) // the turn in flight
	sh.Router = "one"
	tk.Done(t0.Add(20*time.Millisecond), NoUsage, nil)

	inFlight := func(now time.Time) int {
		var s Scratch
		two.refresh(&s.Snapshot, &s.cache, now, 0)
		return s.Snapshot.Replicas[d.Replica].InFlight
	}
	now := t0.Add(30 * time.Millisecond)
	two.Merge(now, []Share{sh})
	if n := inFlight(now); n != 1 {
		t.Fatalf("one's share in flight on %d: %d, want 1", d.Replica, n)
	}
	binding := SessionOf("one", one.reps[d.Replica].id, t0, chain[0].Hashes)

	// A request of another prompt in the same session proves nothing.
	other := &Request{ID: "x", Session: "agent", Chains: []residency.Chain{{Tokens: 16, Hashes: []prefix.Hash{21, 22, 23, 24, 25}}}}
	two.BindPeer(other, binding, now)
	if n := inFlight(now); n != 1 {
		t.Errorf("after a request of another prompt: %d in flight, want 1", n)
	}

	next := &Request{ID: "t2", Session: "agent", Chains: []residency.Chain{{Tokens: 16, Hashes: []prefix.Hash{11, 12, 13, 14, 15, 16}}}}
	two.BindPeer(next, binding, now)
	if n := inFlight(now); n != 0 {
		t.Errorf("after the next turn: %d in flight, want 0 (the turn ended)", n)
	}
	two.BindPeer(next, binding, now) // a retry reads it again
	later := now.Add(100 * time.Millisecond)
	two.Merge(later, []Share{sh}) // one's old share, again
	if n := inFlight(later); n != 0 {
		t.Errorf("one's old share merged again: %d in flight, want 0", n)
	}

	// one's next share, exported since, counts its own: a new request.
	_, tk3 := one.Decide(&Request{ID: "t3", Tokens: 64, MaxTokens: 10, Chains: chain[:0]}, nil, later, &sc)
	fresh := one.Export(later)
	fresh.Router = "one"
	two.Merge(later, []Share{fresh})
	want := 0
	for _, l := range fresh.Load {
		if l.Replica == one.reps[d.Replica].id {
			want = int(l.InFlight)
		}
	}
	if n := inFlight(later); n != want {
		t.Errorf("one's next share: %d in flight on %d, want its %d", n, d.Replica, want)
	}
	if len(two.peers.ended) != 0 {
		t.Errorf("%d ended turns kept after a newer share, want none", len(two.peers.ended))
	}
	tk3.Done(later, NoUsage, nil)
}

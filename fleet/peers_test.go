package fleet

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
)

// TestMergePeers: what one fleet exports, another merges: its load shows
// in the other's snapshots (and leaves with the next Merge without it),
// its sessions pin there, its blocks match there.
func TestMergePeers(t *testing.T) {
	one := newFleet(t, Config{Policy: route.LeastLoaded{}})
	two := newFleet(t, Config{Policy: route.LeastLoaded{}})
	one.SharePeers(0)
	two.SharePeers(0)
	chain := []residency.Chain{{Tokens: 16, Hashes: []prefix.Hash{11, 12, 13, 14}}}
	req := &Request{ID: "r1", Session: "conv", Tokens: 64, MaxTokens: 10, Chains: chain}
	var sc Scratch
	d, tk := one.Decide(req, nil, t0, &sc)
	if tk == nil {
		t.Fatalf("no ticket: %+v", d)
	}
	sh := one.Export(t0)
	if len(sh.Sessions) != 1 || len(sh.Touches) != 1 || len(sh.Load) != 1 {
		t.Fatalf("share: %d sessions, %d touches, %d loads, want 1 each", len(sh.Sessions), len(sh.Touches), len(sh.Load))
	}
	if again := one.Export(t0); len(again.Sessions)+len(again.Touches) != 0 {
		t.Errorf("second Export resent %d sessions, %d touches", len(again.Sessions), len(again.Touches))
	}

	now := t0.Add(50 * time.Millisecond)
	two.Merge(now, []Share{sh})
	var sc2 Scratch
	two.refresh(&sc2.Snapshot, &sc2.cache, now, 0)
	got := sc2.Snapshot.Replicas[d.Replica]
	if got.InFlight != 1 || got.PrefillTokens != 64 {
		t.Errorf("peer load in snapshot: in flight %d, prefill %d, want 1, 64", got.InFlight, got.PrefillTokens)
	}
	if p, _ := two.pin("conv", nil, &sc2.Snapshot, now); p != d.Replica {
		t.Errorf("pin after merge = %d, want %d", p, d.Replica)
	}
	// A least-loaded decision on two avoids the replica one loaded.
	d2, tk2 := two.Decide(&Request{ID: "r2", Tokens: 64, Chains: chain[:0]}, nil, now, &sc2)
	if d2.Replica == d.Replica {
		t.Errorf("two picked replica %d, which one's request occupies", d2.Replica)
	}
	tk2.Done(now, NoUsage, nil)

	// The peer is gone: its load is no longer counted.
	two.Merge(now, nil)
	two.refresh(&sc2.Snapshot, &sc2.cache, now, 0)
	if got := sc2.Snapshot.Replicas[d.Replica]; got.InFlight != 0 || got.PrefillTokens != 0 {
		t.Errorf("after the peer left: in flight %d, prefill %d, want 0, 0", got.InFlight, got.PrefillTokens)
	}
	tk.Done(now, NoUsage, nil)
}

// TestMergeTouches: a peer's routed blocks match in a kv-aware fleet's
// approximate index.
func TestMergeTouches(t *testing.T) {
	f := newFleet(t, Config{})
	chain := []residency.Chain{{Tokens: 16, Hashes: []prefix.Hash{11, 12, 13, 14}}}
	f.Merge(t0, []Share{{Touches: []Touch{{Replica: c, At: t0, Chains: []SharedChain{{Tokens: 16, Hashes: chain[0].Hashes}}}}}})
	match := make([]int, 3)
	var ms residency.MatchScratch
	f.tr.Match(chain, f.indexTime(t0), 16, match, nil, &ms)
	if match[2] != 4 {
		t.Errorf("matched %v after merge, want 4 blocks on replica 2", match)
	}
}

// TestMergeBindingNewerWins: a peer's binding older than this fleet's
// own does not move the session.
func TestMergeBindingNewerWins(t *testing.T) {
	f := newFleet(t, Config{})
	f.bind("s", f.lookup(a), t0.Add(time.Second), nil)
	f.Merge(t0.Add(2*time.Second), []Share{{Sessions: []Binding{{Key: "s", Replica: b, At: t0}}}})
	var s route.Snapshot
	f.Snapshot(&s, t0, 0)
	if p, _ := f.pin("s", nil, &s, t0.Add(2*time.Second)); p != 0 {
		t.Errorf("pin = %d, want 0 (own, newer binding)", p)
	}
	f.Merge(t0.Add(3*time.Second), []Share{{Sessions: []Binding{{Key: "s", Replica: b, At: t0.Add(3 * time.Second)}},
		Load: []PeerLoad{{Replica: "nowhere", InFlight: 5}}}})
	if p, _ := f.pin("s", nil, &s, t0.Add(3*time.Second)); p != 1 {
		t.Errorf("pin = %d, want 1 (the peer's newer binding)", p)
	}
}

// TestBindPeer: a peer's binding read on the request path pins the
// session and marks the blocks of the prompt it was bound with cached on
// its replica when the request extends that prompt; not when it does not
// (another tail), and not at all when this fleet's own binding is newer
// or the replica is unknown.
func TestBindPeer(t *testing.T) {
	chain := []residency.Chain{{Tokens: 16, Hashes: []prefix.Hash{11, 12, 13, 14, 15, 16}}}
	req := &Request{ID: "r", Session: "s", Chains: chain}
	matched := func(f *Fleet) []int {
		match := make([]int, 3)
		var ms residency.MatchScratch
		f.tr.Match(chain, f.indexTime(t0.Add(time.Second)), 16, match, nil, &ms)
		return match
	}
	pinned := func(f *Fleet) int {
		var s route.Snapshot
		f.Snapshot(&s, t0, 0)
		p, _ := f.pin("s", nil, &s, t0.Add(time.Second))
		return p
	}
	f := newFleet(t, Config{})
	if !f.BindPeer(req, SessionOf("", b, t0, chain[0].Hashes[:4]), t0.Add(time.Second)) {
		t.Fatal("BindPeer refused a new session's binding")
	}
	if p, m := pinned(f), matched(f); p != 1 || m[1] != 4 {
		t.Errorf("pin %d, matched %v; want replica 1, its 4 blocks", p, m)
	}

	g := newFleet(t, Config{})
	other := SessionOf("", b, t0, []prefix.Hash{11, 12, 99}) // another prompt's tail
	if !g.BindPeer(req, other, t0.Add(time.Second)) || pinned(g) != 1 || matched(g)[1] != 0 {
		t.Errorf("another prompt: pin %d, matched %v; want replica 1, no blocks", pinned(g), matched(g))
	}

	h := newFleet(t, Config{})
	h.bind("s", h.lookup(a), t0.Add(time.Second), nil)
	if h.BindPeer(req, SessionOf("", b, t0, chain[0].Hashes[:4]), t0.Add(time.Second)) || pinned(h) != 0 {
		t.Errorf("an older peer binding moved the session to %d", pinned(h))
	}
	if h.BindPeer(req, SessionOf("", "http://nowhere", t0.Add(2*time.Second), nil), t0.Add(2*time.Second)) {
		t.Error("a binding to an unknown replica was taken")
	}
}

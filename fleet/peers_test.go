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

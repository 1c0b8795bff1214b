package fleet

import (
	"math"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
)

// TestDisplacedIsTheEvictedShare: replica a stores 5,000 tokens per
// request (4,000 computed, 1,000 generated); after each, a request whose
// prefix a matched long ago is sent to b, where it finds 1,000 of the
// 3,000 tokens a had. The 2,000 it lacked are a's evictions, asked for
// again: a's Displaced is 2,000 / 5,000, and b's, which evicted nothing
// anyone asked for, 0. A stale match the serving engine had cached in
// full counts nothing.
func TestDisplacedIsTheEvictedShare(t *testing.T) {
	f := newFleet(t, Config{Replicas: reps(a, b)})
	now := t0
	for range 200 {
		tk, err := f.Acquire(a, Claim{PrefillTokens: 4000, Tokens: 6000, PromptTokens: 5000}, now)
		if err != nil {
			t.Fatal(err)
		}
		tk.Done(now, Usage{PromptTokens: 5000, CachedTokens: 1000, CompletionTokens: 1000}, nil)
		for _, cached := range []int{1000, 3000} {
			tk, err = f.Acquire(b, Claim{PrefillTokens: 3000, Tokens: 3100, PromptTokens: 3000, Stale: 3000, StaleReplica: 0}, now)
			if err != nil {
				t.Fatal(err)
			}
			tk.Done(now, Usage{PromptTokens: 3000, CachedTokens: cached, CompletionTokens: 100}, nil)
		}
		now = now.Add(time.Second)
	}
	var s route.Snapshot
	f.Snapshot(&s, now, 16)
	if got := s.Replicas[0].Rates.Displaced; math.Abs(got-0.4) > 0.01 {
		t.Errorf("a's Displaced %.4f, want 0.4", got)
	}
	if got := s.Replicas[1].Rates.Displaced; got != 0 {
		t.Errorf("b's Displaced %.4f, want 0", got)
	}
}

// TestStaleMatchIsTheDeepestOld: of the replicas' matches, the one that
// counts for Displaced is the deepest last touched at least half its
// replica's horizon ago; a deeper but younger match is a prefix in use
// (or still being computed), and a replica with no measured horizon
// evicts nothing.
func TestStaleMatchIsTheDeepestOld(t *testing.T) {
	rep := func(h time.Duration) route.Replica { return route.Replica{Rates: route.Rates{Horizon: h}} }
	s := &route.Snapshot{BlockSize: 16, Replicas: []route.Replica{rep(time.Minute), rep(time.Minute), rep(time.Minute), rep(0)}}
	r := &route.Request{Tokens: 5000,
		Match: []int{100, 250, 200, 300}, // blocks
		Age:   []time.Duration{40 * time.Second, 20 * time.Second, 30 * time.Second, time.Hour}}
	if tokens, i := stale(r, s); tokens != 3200 || i != 2 {
		t.Errorf("stale = %d tokens on replica %d, want 3200 on 2", tokens, i)
	}
	r.Tokens = 1000
	if tokens, i := stale(r, s); tokens != 1000 || i != 2 {
		t.Errorf("stale of a 1,000-token prompt = %d on %d, want 1000 on 2", tokens, i)
	}
	r.Age = []time.Duration{time.Second, time.Second, time.Second, time.Hour}
	if tokens, i := stale(r, s); tokens != 0 || i != 0 {
		t.Errorf("stale with young matches = %d on %d, want 0 on 0", tokens, i)
	}
}

// TestDisplacedCountsOnceFullAndImports: a replica of 10,000 tokens'
// capacity evicts nothing while the first 10,000 it stores fill it, so
// those do not count as stored. And an import is not the serving
// engine's own: a request that imported the 2,000 tokens a's stale match
// lacked on b finds them cached, yet a evicted them; b stored them.
func TestDisplacedCountsOnceFullAndImports(t *testing.T) {
	f := newFleet(t, Config{Replicas: reps(a, b), CacheBlocks: 625, BlockSize: 16})
	now := t0
	acquire := func(id string, c Claim) *Ticket {
		tk, err := f.Acquire(id, c, now)
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	// a: 5,000 stored per request; the first two fill it.
	for range 2 {
		acquire(a, Claim{PrefillTokens: 4000, Tokens: 6000, PromptTokens: 5000}).
			Done(now, Usage{PromptTokens: 5000, CachedTokens: 1000, CompletionTokens: 1000}, nil)
	}
	// One request then charges a 2,000 evicted tokens and b, which
	// imported them, 2,000 + 100 stored (b's first, so filling).
	c := Claim{PrefillTokens: 1000, Tokens: 3100, PromptTokens: 3000, Stale: 3000, StaleReplica: 0, Imported: 2000}
	acquire(b, c).Done(now, Usage{PromptTokens: 3000, CachedTokens: 3000, CompletionTokens: 100}, nil)
	var s route.Snapshot
	f.Snapshot(&s, now, 16)
	if got := s.Replicas[0].Rates.Displaced; got != 0 {
		t.Errorf("a's Displaced %.4f with nothing stored past its capacity, want 0", got)
	}
	acquire(a, Claim{PrefillTokens: 4000, Tokens: 6000, PromptTokens: 5000}).
		Done(now, Usage{PromptTokens: 5000, CachedTokens: 1000, CompletionTokens: 1000}, nil)
	f.Snapshot(&s, now, 16)
	// 2,000 evicted over 5,000 stored, both decayed alike within 1%.
	if got := s.Replicas[0].Rates.Displaced; math.Abs(got-0.4) > 0.01 {
		t.Errorf("a's Displaced %.4f, want 0.4 (the import hid none of its evictions)", got)
	}
	if got := s.Replicas[1].Rates.Displaced; got != 0 {
		t.Errorf("b's Displaced %.4f, want 0", got)
	}
}

// TestPreciseModeLearnsDisplaced: with the engines' KV events followed a
// match has no age, so the stale-match rule never fires; what the
// router sent a replica beyond what its events say it holds does. a
// stores a 20-block prompt and a 5,000-token one (4,316 tokens past the
// 1,024 that filled it), then evicts 15 blocks of the first; the request
// asking for them again is sent to b, and a's Displaced learns the 240 of
// 320 tokens b did not find cached. Without the eviction (the second
// fleet) it stays 0.
func TestPreciseModeLearnsDisplaced(t *testing.T) {
	for _, evict := range []bool{true, false} {
		f := newFleet(t, Config{Replicas: reps(a, b), Policy: route.KVAware{Precise: true}, Events: true, CacheBlocks: 64, BlockSize: 16})
		chains := []residency.Chain{{Tokens: 16, Hashes: make([]prefix.Hash, 20)}}
		for i := range chains[0].Hashes {
			chains[0].Hashes[i] = prefix.Hash(1000 + i)
		}
		var sc Scratch
		now := t0
		send := func(want int) *Ticket {
			t.Helper()
			req := &Request{ID: "r", Hash: 1, Tokens: 320, MaxTokens: 10, Chains: chains}
			d, tk := f.Decide(req, []int{1 - want}, now, &sc)
			if tk == nil || d.Replica != want {
				t.Fatalf("decision %+v, want replica %d", d, want)
			}
			return tk
		}
		// a stores the prompt, and enough after it to fill its cache.
		send(0).Done(now, Usage{PromptTokens: 320, CompletionTokens: 10}, nil)
		f.Tracker().Precise().Store(0, chains[0].Hashes, f.indexTime(now))
		tk, err := f.Acquire(a, Claim{PrefillTokens: 5000, Tokens: 5010, PromptTokens: 5000}, now)
		if err != nil {
			t.Fatal(err)
		}
		tk.Done(now, Usage{PromptTokens: 5000, CompletionTokens: 10}, nil)
		now = now.Add(time.Minute) // past the overlay
		if evict {
			f.Tracker().Precise().Remove(0, chains[0].Hashes[5:])
		}
		send(1).Done(now, Usage{PromptTokens: 320, CachedTokens: 80, CompletionTokens: 10}, nil)
		var s route.Snapshot
		f.Snapshot(&s, now, 16)
		want := 0.0
		if evict {
			want = 240.0 / (330 + 5010 - 1024) // evicted over stored past the capacity
		}
		if got := s.Replicas[0].Rates.Displaced; math.Abs(got-want) > 0.1*want+1e-9 {
			t.Errorf("evicted %v: a's Displaced %.4f, want %.4f", evict, got, want)
		}
	}
}

package fleet

import (
	"testing"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/scrape"
)

// chainOf is a chain of n blocks whose first shared blocks are those of
// base (seed 0) and the rest its own.
func chainOf(seed uint64, shared, n int) []prefix.Hash {
	out := make([]prefix.Hash, n)
	for i := range out {
		s := seed
		if i < shared {
			s = 0
		}
		out[i] = prefix.Hash(s<<32 | uint64(i) + 1)
	}
	return out
}

// TestSlotCacheLCP: a prompt goes to the idle slot sharing most with it
// (above the similarity threshold) and reuses that prefix; a prompt that
// shares little takes the least recently used slot.
func TestSlotCacheLCP(t *testing.T) {
	var c slotCache
	c.resize(2)
	a, b := chainOf(1, 0, 40), chainOf(2, 0, 40)
	ca := c.take(a, 0)
	cb := c.take(b, 0)
	if ca.slot == cb.slot || ca.slot < 0 || cb.slot < 0 {
		t.Fatalf("two prompts on two idle slots took slots %d and %d", ca.slot, cb.slot)
	}
	c.release(ca)
	c.release(cb)
	next := append(chainOf(1, 0, 40), chainOf(3, 0, 10)...) // a's next turn
	if got := c.predict(next); got != 40 {
		t.Errorf("next turn predicted to reuse %d blocks, want 40 (its slot's prompt)", got)
	}
	if cl := c.take(next, 0); cl.slot != ca.slot {
		t.Errorf("next turn took slot %d, want %d (longest common prefix)", cl.slot, ca.slot)
	}
	if got := c.predict(chainOf(4, 2, 40)); got != 0 {
		t.Errorf("a prompt sharing 2 of 40 blocks (under the 0.1 similarity) predicted %d, want 0 (LRU slot)", got)
	}
}

// TestSlotCacheDeferred: with every slot busy a prompt waits and takes
// the first slot freed.
func TestSlotCacheDeferred(t *testing.T) {
	var c slotCache
	c.resize(1)
	first := c.take(chainOf(1, 0, 20), 0)
	waiting := c.take(chainOf(2, 0, 20), 0)
	if waiting.slot != -1 {
		t.Fatalf("second prompt on one busy slot took slot %d, want to wait", waiting.slot)
	}
	c.release(first)
	if waiting.slot != 0 || !c.slots[0].busy {
		t.Errorf("after the release the waiting prompt has slot %d (busy %v), want slot 0", waiting.slot, c.slots[0].busy)
	}
	c.release(waiting)
	c.release(waiting) // twice: no effect
	if c.slots[0].busy {
		t.Error("slot busy after its request ended")
	}
}

// TestSlotCacheHostCache: a slot's prompt replaced by another is kept in
// the host prompt cache, and a later prompt that continues it is loaded
// from there.
func TestSlotCacheHostCache(t *testing.T) {
	var c slotCache
	c.resize(1)
	a := chainOf(1, 0, 30)
	c.release(c.take(a, 0))
	c.release(c.take(chainOf(2, 0, 30), 0)) // LRU: a is saved first
	next := append(chainOf(1, 0, 30), chainOf(5, 0, 5)...)
	if got := c.predict(next); got != 30 {
		t.Errorf("a's next turn predicted %d blocks, want 30 (loaded from the host cache)", got)
	}
	c.take(next, 0)
	for _, p := range c.saved {
		if lcp(p.chain, a) == len(a) && len(p.chain) == len(a) {
			t.Error("the loaded prompt is still in the host cache")
		}
	}
}

// toA is a policy that reads the approximate index and routes every
// request to replica 0, keeping the match it was given.
type toA struct{ match []int }

func (p *toA) Pick(r *route.Request, s *route.Snapshot) route.Decision {
	p.match = append(p.match[:0], r.Match...)
	return route.Decision{Replica: 0, Matched: r.Match[0] * s.BlockSize, Reason: "test"}
}

func (p *toA) Needs() route.Needs { return route.Needs{Index: route.Approximate} }

// TestFleetMatchesLlamaCppSlots: a replica whose metrics are llama.cpp's
// is matched by what its slots would reuse, not by the index. Two
// prompts fill its two slots (T, then S); a third shares two of S's 40
// blocks, too little for S's slot (0.1 of the prompt), so it takes the
// least recently used slot, T's, and reuses nothing, though the index
// holds S's first blocks there. A replica of another engine keeps the
// index's match.
func TestFleetMatchesLlamaCppSlots(t *testing.T) {
	for _, llama := range []bool{true, false} {
		p := &toA{}
		f := newFleet(t, Config{Policy: p, Replicas: reps(a, b)})
		if llama {
			f.SetLoad(a, scrape.Load{Engine: scrape.EngineLlamaCpp, Slots: 2})
		}
		var sc Scratch
		send := func(id string, chain []prefix.Hash) {
			req := &Request{ID: id, Tokens: 16 * len(chain), MaxTokens: 8, Chains: []residency.Chain{{Tokens: 16, Hashes: chain}}}
			_, tk := f.Decide(req, nil, t0, &sc)
			if tk == nil {
				t.Fatalf("%s: no ticket", id)
			}
			tk.Done(t0, Usage{}, nil)
		}
		send("T", chainOf(2, 0, 40))
		send("S", chainOf(1, 2, 40))
		send("R", chainOf(3, 2, 40))
		want := 0
		if !llama {
			want = 2
		}
		if p.match[0] != want {
			t.Errorf("llama.cpp %v: R matched %d blocks on replica 0, want %d", llama, p.match[0], want)
		}
	}
}

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

// TestSlotCacheDeferred: with every slot busy a prompt waits and takes
// the first slot freed.
func TestSlotCacheDeferred(t *testing.T) {
	c := newSlotCache()
	c.resize(1)
	first := c.take(chainOf(1, 0, 20), 0)
	waiting := c.take(chainOf(2, 0, 20), 0)
	if waiting.slot != -1 {
		t.Fatalf("second prompt on one busy slot took slot %d, want to wait", waiting.slot)
	}
	c.release(first)
	if waiting.slot != 0 || c.c.Idle() {
		t.Errorf("after the release the waiting prompt has slot %d (slot idle %v), want slot 0", waiting.slot, c.c.Idle())
	}
	c.release(waiting)
	c.release(waiting) // twice: no effect
	if !c.c.Idle() {
		t.Error("slot busy after its request ended")
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

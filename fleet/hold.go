package fleet

import (
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/residency"
)

// A running request holds its prompt's blocks on its replica
// (residency.Index.Hold): the engine cannot evict them while it runs, and
// they start to age, towards the eviction horizon that Churn measures
// from when the engine frees them, only at its end. It runs from its
// admission, which its first token follows by one prefill, to its end;
// before that, queued, it holds nothing (vLLM allocates a request's
// blocks when it schedules it), and its prompt ages from its routing, as
// the decision touched it. The ticket keeps the chain its replica is
// indexed with for the hold and its release. Another router's requests
// (peers.go) are known only by their routing, and age from it.

// ticketHold is a ticket's hold on its prompt's blocks in the index.
type ticketHold struct {
	// mu guards chain, kept and held: FirstToken and Done may come from
	// different goroutines.
	mu sync.Mutex
	// chain is the request's chain on its replica (its Hashes are the
	// caller's: Request.Chains), while kept.
	chain residency.Chain
	kept  bool
	held  bool // Hold recorded, Release due
}

// keepChain has the ticket's request, routed with chains, hold its
// replica's chain of them from its first token to its end.
func (t *Ticket) keepChain(chains []residency.Chain) {
	t.hold.chain, t.hold.kept = t.f.tr.ChainFor(chains, t.r.index)
}

// holdBlocks records at now, the request's first token, that it holds
// its prompt's blocks until Done.
func (t *Ticket) holdBlocks(now time.Time) {
	h := &t.hold
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.kept || h.held {
		return
	}
	var sc residency.MatchScratch
	t.f.tr.Hold(t.r.index, []residency.Chain{h.chain}, t.f.indexTime(now), &sc)
	h.held = true
}

// releaseBlocks ends the request's hold at now, whether it completed or
// failed: the engine frees its blocks either way.
func (t *Ticket) releaseBlocks(now time.Time) {
	h := &t.hold
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held {
		var sc residency.MatchScratch
		t.f.tr.Release(t.r.index, []residency.Chain{h.chain}, t.f.indexTime(now), &sc)
	}
	h.chain, h.kept, h.held = residency.Chain{}, false, false
}

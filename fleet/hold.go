package fleet

import (
	"time"

	"github.com/kvrouter/kvrouter/residency"
)

// A request holds its prompt's blocks on its replica from its decision
// until it ends (residency.Index.Hold): the engine cannot evict them
// meanwhile, and they start to age, towards the eviction horizon that
// Churn measures from when the engine frees them, only at its end. The
// ticket keeps the request's chains for that release. Another router's
// requests (peers.go) are known only by their routing, and age from it.

// hold records in the index that the ticket's request, whose chains were
// just matched with sc, is on its replica from now until Done.
func (f *Fleet) hold(t *Ticket, chains []residency.Chain, now time.Time, sc *residency.MatchScratch) {
	f.tr.Hold(t.r.index, chains, f.indexTime(now), sc)
	t.chains = chains
}

// release ends the hold of the ticket's request at now, whether it
// completed or failed: the engine frees its blocks either way.
func (t *Ticket) release(now time.Time) {
	if t.chains == nil {
		return
	}
	t.f.tr.Release(t.r.index, t.chains, t.f.indexTime(now))
	t.chains = nil
}

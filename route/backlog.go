package route

import "time"

// ReasonSaturated is the reason of a request that no replica can take
// without a wait above the admission limit (package fleet's Admission):
// it is held in the router's queue, or rejected, rather than routed.
const ReasonSaturated = "saturated"

// ReasonUnattainable is the reason of a request that the policy's best
// replica is predicted to miss the SLO of at least as likely as not, and
// that admission (package fleet's Admission.SLO) queues or rejects
// rather than routes.
const ReasonUnattainable = "slo-unattainable"

// Backlog is how long a request of tokens prompt tokens sent to rp now
// would wait before its prefill starts, whatever the policy: the prefill
// queued ahead of it, and, when every seat (MaxSeqs) is taken, the wait
// for one to free. Admission control compares it with its limit.
//
// The queue is the router's own not-yet-started prefill, or the engine's
// waiting requests when its metrics are fresh (scraped within staleAfter)
// and show more, each counted at the mean of the router's own (at tokens
// when it has none). A seat frees every meanOutput × step(MaxSeqs) /
// MaxSeqs on average, step at the nominal context of a sequence.
func Backlog(rp *Replica, tokens, meanOutput int, staleAfter time.Duration) time.Duration {
	rt := rp.Rates.WithDefaults()
	fresh := isFresh(rp, staleAfter)
	wait := time.Duration(rt.queueNS(queuedTokens(rp, fresh, float64(tokens)), 0, 1))
	if over := occupied(rp, fresh) - rt.MaxSeqs + 1; over > 0 {
		seat := float64(time.Duration(meanOutput)*rt.nominalStep(rt.MaxSeqs)) / float64(rt.MaxSeqs)
		wait += time.Duration(float64(over) * seat * rt.DecodeScale)
	}
	return wait
}

// The queue ahead of a request, as Backlog and kv-aware (kvRequest.queued,
// priceWith's seat) count it; each prices it in its own arithmetic.

// isFresh says whether rp's scraped engine metrics count, at staleAfter:
// scraped, and no older.
func isFresh(rp *Replica, staleAfter time.Duration) bool {
	return rp.Scraped && rp.LoadAge <= staleAfter
}

// othersWaiting is the router's own requests on rp not yet past their
// prefill (own) and, when fresh metrics show more waiting requests than
// those, how many more: other clients' (extra; else 0).
func othersWaiting(rp *Replica, fresh bool) (own, extra int) {
	own = max(rp.InFlight-rp.Decoding, 0)
	if extra = rp.Waiting - own; !fresh || extra < 0 {
		extra = 0
	}
	return own, extra
}

// occupied is the requests holding or awaiting a seat on rp: the
// router's own in flight, or the engine's running and waiting when fresh
// and more.
func occupied(rp *Replica, fresh bool) int {
	n := rp.InFlight
	if fresh {
		n = max(n, rp.Running+rp.Waiting)
	}
	return n
}

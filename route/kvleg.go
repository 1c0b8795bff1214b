package route

import "math"

// kvLeg is a prefill leg a source replica would run for the request, as
// the router runs one (vLLM's NixlConnector protocol): the source
// computes the whole prompt as a request of one output token, after its
// queue and with its own prefix cache, and holds its blocks for the
// decode replica to read. A prefill worker runs the legs of a
// disaggregated fleet; a replica that holds the prompt's prefix runs an
// import's.
type kvLeg struct {
	from int // the source; −1: none
	// time is the leg on the source, its wait and its prefill; cached is
	// the prompt tokens the source is expected to cache; others is what
	// the leg costs the source's other requests: the stall of its running
	// decodes and, ttftWeight times, the wait of the requests that arrive
	// behind it. In ns.
	time, cached, others float64
}

// legAt prices the leg replica i (rp), caching cached tokens of the
// prompt, would run for the request, where the requests it delays arrive
// at rate per ns (at DecodeScale 1) and spread over pool sources (a
// prefill worker's legs over the workers, workerRate; an import's
// holder's over itself alone): the prompt queued ahead of it, whose
// iterations also step its running decodes (half a step on a replica
// that decodes with nothing queued), then its prefill of the rest in
// iterations that carry those decodes (only the step overhead on a
// replica that has none, as a prefill worker), and a seat's wait when
// all are taken. The requests that arrive while it waits are each
// delayed by its prefill, and those that arrive while it runs by half
// of it on a source alone; over a pool of sources that the router
// steers each request to, by that over the pool, which runs pool of
// them at once (behind).
func (q *kvRequest) legAt(rp *Replica, i int, cached, rate, pool float64) kvLeg {
	rt := q.rates(&rp.Rates)
	fresh := isFresh(rp, kvStaleAfter)
	batch, context := q.batch(rp, fresh)
	if rp.Role == RolePrefill {
		batch, context = 0, 0 // its sequences are legs in its queue, none decodes
	}
	iter := rt.iterNS(batch, context) * rt.DecodeScale
	queued := queuedTokens(rp, fresh, q.tokens)
	wait := rt.queueNS(queued, iter, 1)
	if batch > 0 && queued == 0 {
		wait += rt.stepNS(batch, context) / 2 * rt.DecodeScale
	}
	wait += q.seat(rp, rt, fresh, batch, context) // a leg takes a seat too
	uncached := q.tokens - cached
	compute := rt.prefillNS(uncached, cached)
	prefill := compute*rt.Scale + math.Ceil(max(uncached, 1)/float64(rt.MaxBatchedTokens))*iter
	behind := rate / rt.DecodeScale * prefill * (wait + prefill/(2*pool))
	others := q.stalled(rp, batch)*compute*rt.Scale + ttftWeight*(behind+q.joined(rp, rt, uncached))
	return kvLeg{from: i, time: wait + prefill, cached: cached, others: others}
}

// joined is the wait a leg of uncached tokens imposes on the legs queued
// on prefill worker rp whose last iteration it joins, in ns: the engine
// fills each iteration to MaxBatchedTokens from its queue in order (vLLM's
// chunked prefill), and a leg ends with the iteration that computes its
// last chunk, so the new leg's first chunk, as much of it as the room left
// in the queue's last iteration, lengthens that iteration for every leg
// that ends in it. Of the router's legs there (Replica.InFlight, its
// PrefillTokens still to compute), the first is taken to be in the
// iteration under way, which it cannot join; the others wait, at the mean
// size, and those in the last iteration are the waiting tokens that spill
// past whole iterations over the mean size, at least one. Zero on a
// replica that decodes: its queue waits behind its decodes' iterations
// (priceWith prices its stall).
func (q *kvRequest) joined(rp *Replica, rt *Rates, uncached float64) float64 {
	if rp.Role != RolePrefill || rp.InFlight < 2 || rp.PrefillTokens <= 0 {
		return 0
	}
	n, budget := float64(rp.InFlight), float64(rt.MaxBatchedTokens)
	per := float64(rp.PrefillTokens) / n
	waiting := per * (n - 1)
	last := math.Mod(waiting, budget)
	legs := min(max(last/per, 1), n-1)
	chunk := min(max(uncached, 1), budget-last)
	return legs * rt.prefillNS(chunk, 0) * rt.Scale
}

// prefillWorker sets q.pw to the leg of the prefill worker that costs
// least, its time to the request's first token (ttftWeight times) and
// to the others (legAt). A prefill worker keeps a prefix cache too. The
// legs it delays are the pool's: those the router sends the workers,
// for as long as the pool stays busy (workerRate), each delayed by its
// prefill over the workers that share them. A worker that cannot
// transfer KV is none.
func (q *kvRequest) prefillWorker(candidates float64) {
	rate, workers, best := -1.0, 1.0, math.Inf(1)
	for i := range q.rows {
		if !q.rows[i].prefills {
			continue
		}
		rp := &q.reps[i]
		rt := q.rates(&rp.Rates)
		if rt.TransferPerMTokens <= 0 {
			continue
		}
		if rate < 0 { // q.arrivals is known once rates has filled the cache
			rate, workers = q.workerRate(candidates)
		}
		l := q.legAt(rp, i, q.cached(rp, i, rt), rate, workers)
		if c := ttftWeight*l.time + l.others; c < best {
			q.pw, best = l, c
		}
	}
}

// workerRate is the rate, per ns at DecodeScale 1, of the legs that a
// leg on a prefill worker delays: those the router sends the workers
// (the legs' share of its requests, the workers' Shares summed, of the
// fleet's rate, candidates × q.arrivals) spread evenly over them, for as
// long as the worker stays busy.
//
// Spread evenly, not at a worker's own Share: the router steers each leg
// to the worker that costs least, so the legs a worker draws next follow
// its queue, not its past. A worker whose legs were long draws few of
// them while it works through them; priced at its own low Share, its
// queue would seem to delay no leg behind it, and it would draw the next
// long prompt too, the worst place for it (behind grows as the square
// of the prefill). Spread evenly, the legs behind a prefill cost the same
// on every worker, and the queue ahead and the cache decide.
//
// For as long as it stays busy: a leg delays the legs that arrive while
// it waits and runs (behind), and they delay those that arrive while
// they run, until the worker next idles. Each unit of work at a server
// busy a share ρ of the time starts a busy period 1/(1 − ρ) times as
// long (M/G/1), so the legs it delays arrive at the rate times 1/(1 − ρ).
// ρ is the share of the workers that have prefill to compute now, taken
// as (busy + 1)/(workers + 2), the mean of its posterior under a uniform
// prior, which a pool of a few workers all busy does not push to 1.
func (q *kvRequest) workerRate(candidates float64) (rate, workers float64) {
	share, n, busy := 0.0, 0, 0
	for i := range q.rows {
		if rp := &q.reps[i]; q.rows[i].prefills && rp.Rates.TransferPerMTokens > 0 {
			share += rp.ShareAt(q.r.Seq, len(q.reps))
			n++
			if rp.PrefillTokens > 0 {
				busy++
			}
		}
	}
	if n == 0 {
		return 0, 1
	}
	idle := float64(n-busy+1) / float64(n+2) // 1 − ρ
	return q.arrivals * candidates * share / float64(n) / idle, float64(n)
}

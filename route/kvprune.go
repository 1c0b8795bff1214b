// The pruned scan kv-aware runs above kvPruneAbove replicas
// (kvChoice.scanPruned): it prices in full (kvmodel.go) only the
// candidates whose lower bound of Total does not already exceed the
// cheapest Total found, which leaves the decision unchanged
// (TestKVAwarePruningMatchesFullPricing). Two bounds, each below the
// next: quick, from a replica's Summary row alone, and bound, from its
// Replica. Each keeps a subset of priceWith's terms at their floor, so a
// new term of the model that is never negative needs no change here; one
// that can be needs its floor in bound.

package route

import (
	"math"
	"slices"
	"sync"
)

// kvPruneAbove is the fleet size up to which every candidate is priced in
// full: the full terms of every candidate explain a decision best, and
// pruning saves little there.
const kvPruneAbove = 64

// kvBounds is what a pruned scan derives of the request for its lower
// bounds of price's Total (bound, quick), beside the model's kvRequest.
type kvBounds struct {
	// computeDeep is the prefill compute of the prompt after the deepest
	// match of any replica, the least any replica's prefill can cost
	// (bound); iters0 the iterations a prefill of the whole prompt takes.
	computeDeep, iters0 float64
	// The decode and its slowdown of the others', unscaled, on a replica
	// of rt whose batch over the decode averages life and their context
	// lifeContext, is decodeFixed + life·decodePerSeq +
	// lifeContext·outPerToken; the request's own decode alone has
	// ownPerSeq for decodePerSeq (quick, quickMisses).
	decodeFixed, decodePerSeq, ownPerSeq, outPerToken float64
	// first is a candidate (a healthy replica), or −1; candidates is
	// their number.
	first, candidates int
	// computes is the compute of the prompt that bounds a prefill's on
	// each path (screen sets it).
	computes [4]float64
	// invOut is 1/out: quickMisses and missFloor take a decode's mean
	// inter-token latency as decode × invOut, which may round a little
	// above decode/out, far less than lowLog's margin under ln.
	invOut float64
	// itlFirst says lowMisses takes the decode's tail before the time to
	// first token's (scanPruned sets it).
	itlFirst bool
	// mixed says the healthy replicas' Rates differ in more than their
	// learned fields (Horizon, the scales, ...): a fleet of several
	// presets, which quick cannot price from one.
	mixed bool
	// hits are the candidates whose prompt's prefill may cost less than
	// the whole prompt's (path): those that match it or whose CPU tier
	// holds some, in replica order, so that a scan of every replica need
	// not read the request's matches.
	hits []int
}

// tierHits adds to q.hits the candidates that match none of the prompt
// on their GPU (matches) but whose CPU tier holds some, keeping them in
// replica order.
func (q *kvRequest) tierHits(matches []int) {
	tiers := q.r.Offloaded[:min(len(q.r.Offloaded), len(q.rows))]
	if len(tiers) == 0 {
		return
	}
	for i, n := range tiers {
		if n > 0 && q.rows[i].preset >= 0 && (i >= len(matches) || matches[i] <= 0) {
			q.hits = append(q.hits, i)
		}
	}
	slices.Sort(q.hits)
}

// setBounds fills q's bounds for the preset of q.rt (setRates).
func (q *kvRequest) setBounds() {
	q.invOut = 1 / q.out
	q.computeDeep = q.rt.prefillNS(q.tokens-q.deepMatch, q.deepMatch)
	q.iters0 = math.Ceil(max(q.tokens, 1) / float64(q.rt.MaxBatchedTokens))
	grow := float64(q.rt.DecodePerSeq) + q.ctx*float64(q.rt.DecodePerMTokens)*1e-6
	q.decodeFixed = q.out * (float64(q.rt.DecodeStep) + grow)
	q.ownPerSeq = q.out * float64(q.rt.DecodePerSeq)
	q.decodePerSeq = q.out * (float64(q.rt.DecodePerSeq) + grow)
	q.outPerToken = q.out * float64(q.rt.DecodePerMTokens) * 1e-6
}

// likely is the healthy replica a pruned scan on a fleet of several
// presets prices first (screen): the least uncached tokens times the batch they
// would stall, plus the queue.
func (q *kvRequest) likely(rs []Replica) int {
	first, least := -1, 0.0
	for i := range rs {
		row := &q.rows[i]
		if row.preset < 0 {
			continue
		}
		if key := float64(rs[i].PrefillTokens) + (q.tokens-q.matched(i))*(1+row.batch); first < 0 || key < least {
			first, least = i, key
		}
	}
	return first
}

// lowLife is a lower bound of life, and lowLife's lifeContext, for a
// replica of batch sequences holding context tokens: the target it keeps
// is at least the fleet's mean batch (kept), and life grows with it.
// (lowLife is at least batch × persist, so the context needs no max.)
func (q *kvRequest) lowLife(batch, context float64) (life, lifeContext float64) {
	life = q.meanBatch + max(batch-q.meanBatch, 0)*q.persist
	return life, context*q.persist + (life-batch*q.persist)*q.perSeq
}

// bound is a lower bound of price's total for replica i. It keeps the
// terms that tell replicas apart cheaply: the queue ahead and the running
// batch, as price has them; the prefill's compute as if its whole match
// were cached here (exact when nothing matches here and nothing can be
// imported or loaded; for a new session, the deepest match of any
// replica), in as many iterations of that batch as that takes, its stall
// of the batch and the wait of the arrivals behind it;
// the decode and its slowdown of the batch's as price has them (life,
// lifeContext); and for a request with an SLO, the miss term at these
// floors (boundMisses). Each term of price
// is at least its counterpart here (a seat's wait, an import's or a
// load's time and memory only add; a new session's later turns add, and
// the share of its copy they take back is at most the prefill of the
// holders' prefix, which the deepest match leaves out), so a candidate
// whose bound exceeds a priced one's Total cannot win. Past above, the
// bound already prunes, and the misses are left out: only whether the
// bound exceeds above matters to a scan.
func (q *kvRequest) bound(rp *Replica, i int, above float64) float64 {
	rt := q.rates(&rp.Rates)
	compute, iters := q.compute0, q.iters0
	switch {
	case q.pw.from >= 0, q.srcLeg.from >= 0, i < len(q.r.Offloaded) && q.r.Offloaded[i] > 0:
		compute, iters = 0, 1 // a prefill worker, a holder's leg, or its CPU tier, may compute or hold it all
	case q.turns > 0:
		// It may share most of its copy's prefill with the sessions
		// after this one (shared).
		compute, iters = q.computeDeep, 1
	case matchOf(q.r, i) > 0:
		// It caches at most its match, on its GPU or its CPU tier
		// (cached, tiered).
		m := q.matched(i)
		compute, iters = rt.prefillNS(q.tokens-m, m), math.Ceil(max(q.tokens-m, 1)/float64(rt.MaxBatchedTokens))
	}
	fresh := isFresh(rp, kvStaleAfter)
	batch, context := q.batch(rp, fresh)
	queued := queuedTokens(rp, fresh, q.tokens)
	step := rt.stepNS(batch, context)
	wait := rt.queueNS(queued, step, rt.DecodeScale)
	prefill := compute*rt.Scale + iters*rt.iterNS(batch, context)*rt.DecodeScale
	// The decode and its slowdown of the others' as price has them, over
	// the batch the request meets on average (life).
	life := q.life(batch, q.kept(rp))
	grow := float64(rt.DecodePerSeq) + q.ctx*float64(rt.DecodePerMTokens)*1e-6
	decode := q.out * (rt.stepNS(life, q.lifeContext(batch, context, life)) + grow) * rt.DecodeScale
	total := ttftWeight*(wait+prefill) + decode + life*q.out*grow*rt.DecodeScale + q.stalled(rp, batch)*compute*rt.Scale + ttftWeight*q.behind(rt, wait, prefill)
	if !q.slo.on() || total > above {
		return total
	}
	st := kvStall{batch: batch, step: step * rt.DecodeScale, stall: q.stall(rp, rt, batch),
		compute: compute * rt.Scale, grow: grow * rt.DecodeScale, joiners: q.arrivals / rt.DecodeScale * prefill}
	return q.boundMisses(rp, total, above, wait+prefill, decode, &st)
}

// boundMisses is bound's total with the miss term at bound's floors: the
// request's own misses at its floor of the time to first token, ttft,
// and at its decode (over is increasing), and, while they do not exceed
// above, the others' (pushedMisses) at the floors of the prefill's
// compute and of the arrivals during it (st). The own misses' normal
// tails are taken from a table (lowMisses, highMisses), and exactly
// (Erfc) only when the table's bounds of them, with the others', fall on
// either side of above; the others' exactly, which costs less than the
// price it may spare.
func (q *kvRequest) boundMisses(rp *Replica, total, above, ttft, decode float64, st *kvStall) float64 {
	sT, sI := spreads(&rp.Rates)
	low, out := q.lowMisses(sT, sI, total, above, ttft, decode/q.out)
	if out {
		return low
	}
	pushed := max(q.pushedMisses(rp, st), 0)
	if low+pushed > above || q.highMisses(&rp.Rates, total, ttft, decode)+pushed <= above {
		return low + pushed // priced out, or in, without the own tails' Erfc
	}
	cost, _ := q.ownMisses(&rp.Rates, ttft, decode)
	return total + cost + pushed
}

// screen is a pick's scratch: a Summary of the snapshot when it carries
// none (own), and a pruned scan's quick bounds and which it priced, one
// per replica, so that the scan reads a few bytes of each replica it does
// not price, not its Replica. Picks take one from screens and return it.
type screen struct {
	own    Summary
	quick  []float64
	priced []bool
	hits   []int // kvRequest.hits's buffer
	// top are the replicas of the least quick bounds, least first (−1:
	// none), which screen finds.
	top [4]int
}

var screens = sync.Pool{New: func() any { return new(screen) }}

// summary is s's Summary when it carries one kept for p, or sc's own
// filled from s.
func (sc *screen) summary(p KVAware, s *Snapshot) *Summary {
	stale := kvStaleAfter
	if m := s.Summary; m != nil && m.staleAfter == stale && m.Len() == len(s.Replicas) {
		return m
	}
	sc.own.staleAfter = stale
	sc.own.fill(s)
	return &sc.own
}

// size makes sc's slices n long, none priced.
func (sc *screen) size(n int) {
	if cap(sc.quick) < n {
		sc.quick, sc.priced, sc.hits = make([]float64, n), make([]bool, n), make([]int, 0, n)
	}
	sc.quick, sc.priced = sc.quick[:n], sc.priced[:n]
	clear(sc.priced)
}

// The paths of a prompt's prefill on a replica, whose compute bounds its
// prefill's (kvRequest.computes): the whole prompt's compute; the compute
// after the deepest match, for a replica that matches (or may import);
// none, for a replica whose CPU tier may hold it all.
const (
	pathWhole uint8 = iota
	pathDeep
	pathTier
)

// path is replica i's path for the request.
func (q *kvRequest) path(i int) uint8 {
	switch {
	case i < len(q.r.Offloaded) && q.r.Offloaded[i] > 0:
		return pathTier
	case i < len(q.r.Match) && q.r.Match[i] > 0:
		return pathDeep
	}
	return pathWhole
}

// quick is a lower bound of bound's total for candidate i, cheaper to
// take from its summary row: the decode and its slowdown of the others'
// at lowLife, the prefill's compute as bound takes it, ttftWeight times
// and once for each sequence it stalls, and the router's own queue ahead
// of it, ttftWeight times. It takes q.rt's preset fields for the
// replica's, so it holds only on a fleet of one preset (!q.mixed), once
// screen has set q.computes.
func (q *kvRequest) quick(i int) float64 {
	t := &q.rows[i]
	life, context := q.lowLife(t.batch, t.context)
	return (q.decodeFixed+life*q.decodePerSeq+q.outPerToken*context)*t.decodeScale +
		q.computes[q.path(i)&3]*(t.stall+t.stallInv*q.invScale) + t.queue
}

// missFloor is a floor of the request's own misses, in ns of Total, on
// every candidate of a fleet of one preset whose quick bound is at most
// above (0 without an ITL bound), for a pruned scan to add to each of
// those: the decode's tail at the least decode quickMisses can take on
// any (lowLife is at least the fleet's mean batch, and its context at
// least that batch's share 1 − persist of the fleet's mean context per
// sequence), at the least DecodeScale and spread of those candidates
// that make the tail least, rounded as lowMisses rounds it.
func (q *kvRequest) missFloor(quick []float64, above float64) float64 {
	if q.slo.itl <= 0 || q.mixed {
		return 0
	}
	scale, least, most := math.Inf(1), math.Inf(1), 0.0
	for i, lb := range quick { // comparisons, not min and max, which order NaNs and zeros
		t := &q.rows[i]
		if lb > above || t.preset < 0 {
			continue
		}
		if t.decodeScale < scale {
			scale = t.decodeScale
		}
		if t.decodeSpread < least {
			least = t.decodeSpread
		}
		if t.decodeSpread > most {
			most = t.decodeSpread
		}
	}
	mean := q.meanBatch
	itl := (q.decodeFixed + mean*q.ownPerSeq + q.outPerToken*(mean*(1-q.persist)*q.perSeq)) * scale * q.invOut
	// The tail is monotone in the spread, rising under the bound and
	// falling past it: least at one end.
	p := min(lowOver(itl, q.slo.logITL, least), lowOver(itl, q.slo.logITL, most))
	return (1 - (1 - p)) * q.slo.price
}

// quickMisses is lb, candidate i's quick bound, plus its own misses
// (lowMisses) at floors of its time to first token and of its decode
// from its row: the router's own queue and the prefill's compute as
// quick has them, and the decode at lowLife. It stops at a value past
// above once the first is, and is at most bound's total, so a candidate
// it puts past above need not be bounded. For a request with an SLO on a
// fleet of one preset, once screen has run.
func (q *kvRequest) quickMisses(i int, lb, above float64) float64 {
	t := &q.rows[i]
	life, context := q.lowLife(t.batch, t.context)
	itl := (q.decodeFixed + life*q.ownPerSeq + q.outPerToken*context) * t.decodeScale * q.invOut
	low, _ := q.lowMisses(t.spread, t.decodeSpread, lb, above, t.queue/ttftWeight+q.computes[q.path(i)&3]*t.scale, itl)
	return low
}

// screen fills sc.quick with each replica's quick bound (+Inf for one
// that is not a candidate; 0 on a fleet of several presets, where quick
// does not hold) and returns the replica a pruned scan prices first: the
// least bound's, or on a fleet of several presets, likely's. q.first must
// be a candidate.
func (q *kvRequest) screen(sc *screen) int {
	if q.mixed {
		for i := range q.rows {
			sc.quick[i] = 0
			if q.rows[i].preset < 0 {
				sc.quick[i] = math.Inf(1)
			}
		}
		return q.likely(q.reps)
	}
	q.rates(&q.reps[q.first].Rates) // fills the preset's fields quick reads
	whole := q.compute0
	if q.turns > 0 {
		// For a new session, every replica may have most of its copy's
		// prefill shared (shared).
		whole = q.computeDeep
	}
	deep := q.computeDeep
	if q.pw.from >= 0 || q.srcLeg.from >= 0 { // a leg may compute it for any replica
		whole, deep = 0, 0
	}
	q.computes = [4]float64{pathWhole: whole, pathDeep: deep, pathTier: 0}
	// quick, for every row, with what it reads of q hoisted: the same
	// operations in the same order (TestKVAwarePruningMatchesFullPricing
	// compares the two). This is the one hand-inlined copy of a formula
	// in kv-aware, and it pays: quick's formula as a helper the loop
	// calls (inlined, over a struct of what it reads) took BenchmarkPick
	// at 1,000 replicas from 5.3 to 7.6 µs.
	// Every row as if its prefill were the whole prompt's (a row that is
	// not a candidate has an infinite queue, so its bound is too), then
	// the hits on their own paths.
	fixed, perLife, perToken, persist, mean, perSeq, invScale := q.decodeFixed, q.decodePerSeq, q.outPerToken, q.persist, q.meanBatch, q.perSeq, q.invScale
	quick, rows := sc.quick[:len(q.rows)], q.rows
	for i := range quick {
		t := &rows[i]
		excess := t.batch - mean // lowLife's, with its max as a branch
		if excess < 0 {
			excess = 0
		}
		life := mean + excess*persist
		context := t.context*persist + (life-t.batch*persist)*perSeq
		quick[i] = (fixed+life*perLife+perToken*context)*t.decodeScale + whole*(t.stall+t.stallInv*invScale) + t.queue
	}
	for _, i := range q.hits {
		quick[i] = q.quick(i)
	}
	// The least bounds, apart (the loops above carry nothing): the
	// first replaces the last of sc.top only where it is less.
	top, least := [len(sc.top)]int{q.first, -1, -1, -1}, [len(sc.top)]float64{math.Inf(1), math.Inf(1), math.Inf(1), math.Inf(1)}
	last := len(top) - 1
	for i, lb := range quick {
		if lb < least[last] {
			k := last
			for ; k > 0 && lb < least[k-1]; k-- {
				top[k], least[k] = top[k-1], least[k-1]
			}
			top[k], least[k] = i, lb
		}
	}
	sc.top = top
	return top[0]
}

// likeliest is the replica a pruned scan for a request with an SLO
// prices first: of those of the least quick bounds (sc.top), the one
// whose own misses add least (quickMisses), so that a candidate the
// misses make dear does not set the first price.
func (q *kvRequest) likeliest(sc *screen, best int) int {
	if q.mixed {
		return best
	}
	least := math.Inf(1)
	for _, i := range sc.top {
		if i < 0 || q.rows[i].preset < 0 {
			continue
		}
		if lb := q.quickMisses(i, sc.quick[i], math.Inf(1)); lb < least {
			best, least = i, lb
		}
	}
	return best
}

// deepest is the most expected cached tokens over the healthy replicas
// whose match exceeds floor tokens (for the reason, when some were
// pruned).
//
// Only whether one caches more than floor, and a whole block, matters to
// the reason, so it stops at the first that does.
func (q *kvRequest) deepest(rs []Replica, floor int) int {
	most := 0
	for i := range q.r.Match[:min(len(q.r.Match), len(rs))] {
		if rp := &rs[i]; rp.Healthy && int(q.matched(i)) > floor {
			most = max(most, int(q.cached(rp, i, q.rates(&rp.Rates))))
			if most > floor && most >= q.bs {
				break
			}
		}
	}
	return most
}

// scanPruned is the pruned scan of pick above kvPruneAbove replicas. A
// good first candidate makes the bounds bite: the least quick bound's on
// a fleet of one preset (screen). It is priced once, and its cost
// recorded in its place in the scan. Then each candidate whose quick
// bound and bound do not exceed the cheapest Total so far is priced; the
// pinned candidate always is. sc.quick is +Inf for a replica that is not
// a candidate (which a Total of +Inf does not prune), 0 for every
// candidate on a fleet of several presets, and −Inf for the pinned
// candidate; sc.priced says which were priced. q.first must be a
// candidate.
func (c *kvChoice) scanPruned(q *kvRequest, sc *screen) {
	rs := q.reps
	first := q.screen(sc)
	if q.slo.on() {
		first = q.likeliest(sc, first)
	}
	firstCost, total := q.price(&rs[first], first)
	c.consider(q, first, &firstCost, total)
	if q.slo.on() {
		// The tail that is the larger on the first candidate is the one
		// more likely to price the others out alone (lowMisses).
		sT, sI := spreads(&rs[first].Rates)
		ttft, itl := float64(firstCost.Wait+firstCost.Prefill), float64(firstCost.Decode)*q.invOut
		q.itlFirst = q.slo.itl > 0 && lowOver(itl, q.slo.logITL, sI) > lowOver(ttft, q.slo.logTTFT, sT)
	}
	pinned := q.r.Pinned
	if pinned >= 0 && pinned < len(rs) && q.rows[pinned].preset >= 0 {
		sc.quick[pinned] = math.Inf(-1)
	}
	priced, above := 0, c.total*(1+1e-9)
	misses, floor := q.slo.on() && !q.mixed, q.missFloor(sc.quick, above)
	for i, lb := range sc.quick {
		switch {
		case lb+floor > above || q.rows[i].preset < 0: // pruned, or not a candidate
			continue
		case i == first:
			c.record(firstCost)
		case i != pinned && (misses && q.quickMisses(i, lb, above) > above || q.bound(&rs[i], i, above) > above):
			continue
		default:
			c.price(q, i)
			above = c.total * (1 + 1e-9)
		}
		sc.priced[i], priced = true, priced+1
	}
	c.pruned = q.candidates - priced
	for _, i := range q.hits {
		if !sc.priced[i] {
			c.maxPruned = max(c.maxPruned, int(q.matched(i)))
		}
	}
}

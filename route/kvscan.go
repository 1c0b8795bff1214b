package route

import (
	"math"
	"time"
)

// Pick chooses the replica with the least expected cost. It allocates
// nothing: the terms are computed in float64 nanoseconds and converted to
// Durations only for the recorded costs.
//
// Most replicas of a large fleet (over kvPruneAbove) cannot win, and the
// scan proves it cheaply. A lower bound of a replica's Total is the Wait of
// the router's own queue, plus Prefill and Decode as if every token the
// index matched were still cached and with the lesser of the two batch
// sizes Decode may use; the other clients' queue, the full-batch penalty
// and Memory only add to it. Once that bound exceeds the cheapest Total
// found so far, or equals it and the replica would lose the tie, the
// replica is recorded as Pruned and nothing else of it is computed, not
// even the exponential of its residency. The decision, reason included, is
// the one full pricing of every replica gives (TestKVAwareMatchesReference
// checks it against kvAwareRef, a plain rendering of the model): a pruned
// replica can neither win nor tie. The pinned replica, whose PinBonus may
// lower its Total, is always priced in full.
//
// What depends only on the request, or on the Rates shared by consecutive
// replicas (all but Scale and Horizon, which are per replica), is computed
// once; full pricing (price) and a change of Rates are calls, out of the
// loop that tests the bound (scan).
func (p KVAware) Pick(r *Request, s *Snapshot) Decision {
	var sc kvScan
	sc.start(p, r, s)
	st := kvBest{best: -1, bestTotal: math.Inf(1), costs: costsFor(r, len(s.Replicas))}
	rs := s.Replicas
	for i := 0; i < len(rs); i++ {
		i = sc.scan(rs, i, &st)
		if i < len(rs) {
			sc.setRates(&rs[i].Rates)
			i-- // price replica i with them
		}
	}
	if st.best < 0 {
		return Decision{Replica: -1, Reason: ReasonNoHealthy, Costs: st.costs}
	}
	return Decision{Replica: st.best, Reason: sc.reason(rs, &st), Matched: st.bestCached, Costs: st.costs}
}

// kvBest is the state of a scan carried from replica to replica: the
// cheapest so far (bestTotal +Inf before the first), the deepest expected
// cached tokens among the replicas priced in full, the deepest match of a
// pruned one, and the costs recorded.
type kvBest struct {
	best, bestCached, maxCached, maxPruned int
	bestTotal                              float64
	costs                                  []Cost
}

// tieKey is what a replica must stay below to win a tie against st's
// best (KVAware.tieBefore): none wins one against the pinned replica. Only
// meaningful once st has a best.
func (st *kvBest) tieKey(r *Request) uint64 {
	if st.best == r.Pinned {
		return 0
	}
	return tieKey(r.Hash, st.best)
}

// scan goes through the replicas rs from j on: it prunes those whose lower
// bound exceeds st's best Total and prices the others (price). It stops at
// the first healthy replica whose Rates differ from those of sc.tm, and
// returns its index (not priced: the caller switches Rates and calls
// again), or len(rs) at the end.
func (sc *kvScan) scan(rs []Replica, j int, st *kvBest) int {
	tm := &sc.tm
	pinned, prune, tokens, bs, prefill0 := sc.r.Pinned, sc.prune, sc.r.Tokens, sc.bs, sc.prefill0
	perTok, step, perSeq, invSeqs := tm.perTok, tm.step, tm.perSeq, tm.invSeqs
	match := sc.r.Match
	// st's fields live in locals here (in registers, not carried from one
	// replica to the next through memory), and go back to st around price.
	maxPruned, best, costs := st.maxPruned, st.best, st.costs
	hash, bestKey := sc.r.Hash, st.tieKey(sc.r)
	// limit is the Total a bound must exceed (or equal, losing the tie) to
	// prune: NaN, which no bound exceeds or equals, when it may not.
	limit := math.NaN()
	if prune {
		limit = st.bestTotal
	}
	for ; j < len(rs); j++ {
		rp := &rs[j]
		if !rp.Healthy {
			continue
		}
		if !tm.same(&rp.Rates) {
			break
		}
		m := 0 // tokens matched in the index: at least the expected cached
		if j < len(match) && match[j] > 0 {
			m = max(min(match[j]*bs, tokens), 0)
		}
		prefill := prefill0
		if m > 0 {
			prefill = tm.prefill(float64(tokens-m), float64(m))
		}
		// The bound, summed as price sums Total. Prefill decreases as the
		// cached tokens grow, Decode grows with the batch and the prefill
		// (counts ≥ 0), and each float operation is monotone, so it rounds
		// to at most Total.
		batch := float64(min(rp.Running, rp.Decoding))
		scale := 1.0
		if rp.Rates.Scale > 0 {
			scale = rp.Rates.Scale
		}
		bound := float64(rp.PrefillTokens)*perTok*scale + prefill*scale + (step+batch*perSeq+prefill*batch*invSeqs)*scale
		// At equal cost the bound prunes too if the replica loses the tie.
		if (bound > limit || bound == limit && best >= 0 && tieKey(hash, j) >= bestKey) &&
			j != pinned && rp.PrefillTokens|rp.Running|rp.Decoding >= 0 {
			maxPruned = max(maxPruned, m)
			if costs != nil {
				costs = costs[:len(costs)+1]
				costs[len(costs)-1] = Cost{Replica: j, Matched: m, Total: time.Duration(bound), Pruned: true}
			}
			continue
		}
		c := 0
		if m > 0 {
			c = sc.cached(j, m, rp)
		}
		st.costs = costs
		sc.price(rp, j, c, scale, st)
		best, bestKey, costs = st.best, st.tieKey(sc.r), st.costs
		if prune {
			limit = st.bestTotal
		}
	}
	st.maxPruned, st.costs = maxPruned, costs
	return j
}

// reason is kvReason for st's best, with the deepest expected cached
// tokens over every candidate: those of the pruned ones are computed only
// if their match could exceed the best's.
func (sc *kvScan) reason(rs []Replica, st *kvBest) string {
	r, maxCached := sc.r, st.maxCached
	if st.maxPruned > st.bestCached && !(st.best == r.Pinned && matchOf(r, st.best) > 0) {
		// Only whether some candidate caches more than the best matters,
		// and whether one caching more holds a whole block.
		for j, k := range r.Match[:min(len(r.Match), len(rs))] {
			if m := min(k*sc.bs, r.Tokens); k > 0 && m > st.bestCached && rs[j].Healthy {
				maxCached = max(maxCached, sc.cached(j, m, &rs[j]))
				if maxCached > st.bestCached && maxCached >= sc.bs {
					break
				}
			}
		}
	}
	return kvReason(r, st.best, st.bestCached, maxCached, sc.bs)
}

// price prices replica rp (index i) in full, records its costs and keeps it
// in st if it is the cheapest so far. cached is its expected cached
// tokens, scale its Rates.Scale with the default filled.
//
//go:noinline
func (sc *kvScan) price(rp *Replica, i, cached int, scale float64, st *kvBest) {
	tm := &sc.tm
	prefill := sc.prefill0
	if cached > 0 {
		prefill = tm.prefill(float64(sc.r.Tokens-cached), float64(cached))
	}
	fresh := rp.Scraped && rp.LoadAge <= sc.staleAfter
	batch := float64(rp.Decoding)
	if fresh {
		batch = float64(rp.Running)
	}
	ps, ds := prefill*scale, (tm.step+batch*tm.perSeq+prefill*batch*tm.invSeqs)*scale
	need := sc.need0
	if cached > 0 {
		need = (float64(sc.r.Tokens-cached) + sc.outF) * sc.invBS
	}

	// Wait: queued prefill work (ours, plus others' seen in fresh
	// metrics) and a full-batch penalty.
	queued := rp.PrefillTokens
	own := max(rp.InFlight-rp.Decoding, 0)
	occupancy := rp.InFlight
	if fresh {
		if extra := rp.Waiting - own; extra > 0 {
			per := sc.r.Tokens
			if own > 0 {
				per = rp.PrefillTokens / own
			}
			queued += extra * per
		}
		occupancy = max(occupancy, rp.Running+rp.Waiting)
	}
	wait := float64(queued) * tm.perTok
	if occupancy >= tm.busyAt { // float64(occupancy) − maxSeqs + 1 > 0
		// One slot frees every out × step(MaxSeqs) / MaxSeqs on average.
		over := float64(occupancy) - tm.maxSeqs + 1
		wait += over * sc.outF * tm.slot * tm.invSeqs
	}

	// Memory: when admitting need more blocks pushes the KV usage above
	// HighWater, evictions of cached prefixes others would reuse, and above
	// 1 a preemption and recompute. Usage is in blocks, or a fraction when
	// the capacity is unknown (then this request's share is unknown too).
	highWater, bsF := sc.p.HighWater, float64(sc.bs)
	memory := 0.0
	capacity, after, full := float64(rp.CacheBlocks), 0.0, false
	if capacity <= 0 {
		capacity, after, full = 1, rp.KVUsage, fresh && rp.KVUsage > highWater
	} else {
		used := float64(rp.DecodeBlocks)
		// max(used, KVUsage×capacity) when fresh; as a compare, since used
		// (a count) is never NaN or −0.
		if x := rp.KVUsage * capacity; fresh && (x > used || x != x) {
			used = x
		}
		after = used + need
		full = after > highWater*capacity
	}
	if full {
		// Never below 0, when after/capacity rounds under HighWater.
		frac := max((after/capacity-highWater)/(1-highWater), 0)
		memory = frac * tm.prefill(need*bsF, 0)
		if after > capacity {
			ctx := need * bsF
			if rp.InFlight > 0 && rp.DecodeBlocks > 0 {
				ctx = float64(rp.DecodeBlocks*sc.bs) / float64(rp.InFlight)
			}
			memory += tm.prefill(ctx, 0)
		}
	}

	wait, memory = wait*scale, memory*scale
	total := wait + ps + ds + memory
	if i == sc.r.Pinned && sc.pinBonus > 0 {
		total = max(total-sc.pinBonus, 0)
	}
	if st.costs != nil {
		st.costs = st.costs[:len(st.costs)+1]
		fill(&st.costs[len(st.costs)-1], i, cached, wait, ps, ds, memory, total)
	}
	st.maxCached = max(st.maxCached, cached)
	if st.best < 0 || total < st.bestTotal || total == st.bestTotal && sc.p.tieBefore(sc.r, i, st.best) {
		st.best, st.bestTotal, st.bestCached = i, total, cached
	}
}

// fill writes one candidate's terms, in ns, into c, field by field
// (building a Cost and copying it stalls on store forwarding), as priced
// in full (Pruned false).
func fill(c *Cost, i, cached int, wait, prefill, decode, memory, total float64) {
	c.Replica, c.Matched = i, cached
	c.Wait, c.Prefill, c.Decode = time.Duration(wait), time.Duration(prefill), time.Duration(decode)
	c.Memory, c.Total, c.Pruned = time.Duration(memory), time.Duration(total), false
}

// kvScan is one Pick's per-request invariants, and the timing of the last
// replica's Rates, reused while consecutive replicas share them (the usual
// case: one preset, with a Scale per replica).
type kvScan struct {
	p          KVAware // with defaults
	r          *Request
	bs, out    int
	outF       float64 // out as float64
	invBS      float64 // 1 / bs
	staleAfter time.Duration
	pinBonus   float64 // p.PinBonus in ns
	need0      float64 // blocks an unmatched replica allocates: (Tokens + out) / bs
	prune      bool    // prune with the lower bound: it holds, and the fleet is large
	tm         timing
	prefill0   float64 // prefill of the whole prompt with tm, in ns, unscaled
}

// start fills sc for request r on snapshot s, with the default Rates.
func (sc *kvScan) start(p KVAware, r *Request, s *Snapshot) {
	sc.p, sc.r, sc.bs, sc.out = p.withDefaults(), r, blockSize(s), r.MaxTokens
	if sc.out <= 0 {
		sc.out = sc.p.MeanOutput
	}
	sc.outF = float64(sc.out)
	sc.invBS = 1 / float64(sc.bs)
	sc.staleAfter = sc.p.StaleAfter
	sc.pinBonus = float64(sc.p.PinBonus)
	sc.need0 = (float64(r.Tokens) + sc.outF) * sc.invBS
	// With Tokens < 0 others' queue (extra × Tokens) could lower Wait.
	sc.prune = r.Tokens >= 0 && len(s.Replicas) > kvPruneAbove
	sc.tm.set(&Rates{})
	sc.prefill0 = sc.tm.prefill(float64(r.Tokens), 0)
}

// setRates switches sc to rt, a replica's Rates other than the last one's.
// Not inlined: it runs once per Pick in a one-preset fleet.
//
//go:noinline
func (sc *kvScan) setRates(rt *Rates) {
	sc.tm.set(rt)
	sc.prefill0 = sc.tm.prefill(float64(sc.r.Tokens), 0)
}

// kvPruneAbove is the fleet size up to which every candidate is priced in
// full: pruning saves little there (about 1 µs at 64 replicas), and the
// full terms of every candidate explain a decision best.
const kvPruneAbove = 64

// cached is the expected cached tokens of the request on replica j (rp),
// which matched m > 0 tokens in the index: p × m, p = exp(−Age/Horizon) the
// probability the prefix is still resident.
func (sc *kvScan) cached(j, m int, rp *Replica) int {
	a := time.Duration(0)
	if j < len(sc.r.Age) {
		a = sc.r.Age[j]
	}
	return int(residency(a, rp.Rates.Horizon) * float64(m))
}

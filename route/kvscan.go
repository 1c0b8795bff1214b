package route

import (
	"math"
	"time"
)

// Pick chooses the replica with the least expected cost. It allocates
// nothing: the terms are computed in float64 nanoseconds and converted to
// Durations only for the recorded costs.
//
// The scan is tuned for about 10 ns per replica (BenchmarkPick): what
// depends only on the request, or on the Rates shared by consecutive
// replicas, is computed once; the expected cached tokens of a chunk of
// replicas are computed ahead (resident), so that their exponentials
// overlap; and the pricing loop (scan) calls nothing, leaving only a change
// of Rates and an exact tie to the caller. The arithmetic is the cost model
// of KVAware's doc, operation for operation; TestKVAwareGoldenDigest pins
// every decision and recorded cost bit for bit.
func (p KVAware) Pick(r *Request, s *Snapshot) Decision {
	var sc kvScan
	sc.start(p, r, s)
	st := kvBest{best: -1, costs: costsFor(r, len(s.Replicas))}
	var resident [kvChunk]int
	rs := s.Replicas
	for lo := 0; lo < len(rs); lo += kvChunk {
		chunk := rs[lo:min(lo+kvChunk, len(rs))]
		cached := resident[:len(chunk)]
		sc.resident(rs, lo, cached)
		for j := 0; ; {
			if j = sc.scan(chunk, lo, j, cached, &st); j == len(chunk) {
				break
			}
			if rt := &chunk[j].Rates; !sc.tm.same(rt) {
				sc.setRates(rt) // then price replica lo+j with them
				continue
			}
			// Replica lo+j, priced and recorded, ties the best.
			if p.tieBefore(r, lo+j, st.best) {
				st.best, st.bestCached = lo+j, cached[j]
			}
			j++
		}
	}
	if st.best < 0 {
		return Decision{Replica: -1, Reason: ReasonNoHealthy, Costs: st.costs}
	}
	return Decision{Replica: st.best, Reason: kvReason(r, st.best, st.bestCached, st.maxCached, sc.bs), Matched: st.bestCached, Costs: st.costs}
}

// kvBest is the state of a scan carried from replica to replica: the
// cheapest so far, the deepest predicted match, and the costs recorded.
type kvBest struct {
	best, bestCached, maxCached int
	bestTotal                   float64
	costs                       []Cost
}

// scan prices the replicas of chunk (chunk[0] is replica lo) from j on,
// cached[j] being chunk[j]'s expected cached tokens, records their costs
// and keeps the cheapest in st. It stops at the first healthy replica whose
// Rates differ from those of sc.tm (not priced: the caller switches Rates
// and calls again) or whose total ties st's best (priced and recorded: the
// caller breaks the tie), and returns its index, or len(chunk) at the end.
// It calls nothing, so that the compiler keeps the scan in registers
// instead of saving them around calls.
func (sc *kvScan) scan(chunk []Replica, lo, j int, cached []int, st *kvBest) int {
	tm, r := &sc.tm, sc.r
	staleAfter, highWater, pinBonus, outF := sc.staleAfter, sc.p.HighWater, sc.pinBonus, sc.outF
	tokens, pinned, bsF := r.Tokens, r.Pinned, float64(sc.bs)
	best, bestCached, maxCached, bestTotal, costs := st.best, st.bestCached, st.maxCached, st.bestTotal, st.costs
	cached = cached[:len(chunk)]
	for j = max(j, 0); j < len(chunk); j++ {
		rp := &chunk[j]
		if !rp.Healthy {
			continue
		}
		if !tm.same(&rp.Rates) {
			break
		}
		i := lo + j
		cached := cached[j]
		prefill, need := sc.prefill0, sc.need0
		if cached > 0 {
			uncached := float64(tokens - cached)
			prefill = tm.prefill(uncached, float64(cached))
			need = (uncached + outF) * sc.invBS
		}
		fresh := rp.Scraped && rp.LoadAge <= staleAfter

		// Wait: queued prefill work (ours, plus others' seen in fresh
		// metrics) and a full-batch penalty.
		queued := rp.PrefillTokens
		own := max(rp.InFlight-rp.Decoding, 0)
		occupancy := rp.InFlight
		batch := float64(rp.Decoding)
		if fresh {
			if extra := rp.Waiting - own; extra > 0 {
				per := tokens
				if own > 0 {
					per = rp.PrefillTokens / own
				}
				queued += extra * per
			}
			occupancy = max(occupancy, rp.Running+rp.Waiting)
			batch = float64(rp.Running)
		}
		wait := float64(queued) * tm.perTok
		if occupancy >= tm.busyAt { // float64(occupancy) − maxSeqs + 1 > 0
			// One slot frees every out × step(MaxSeqs) / MaxSeqs on average.
			over := float64(occupancy) - tm.maxSeqs + 1
			wait += over * outF * tm.slot * tm.invSeqs
		}

		decode := tm.step + batch*tm.perSeq + prefill*batch*tm.invSeqs

		// Memory: when admitting need more blocks pushes the KV usage above
		// HighWater, evictions of cached prefixes others would reuse, and
		// above 1 a preemption and recompute. Usage is in blocks, or a
		// fraction when the capacity is unknown (then this request's share
		// is unknown too).
		memory := 0.0
		capacity, after, full := float64(rp.CacheBlocks), 0.0, false
		if capacity <= 0 {
			capacity, after, full = 1, rp.KVUsage, fresh && rp.KVUsage > highWater
		} else {
			used := float64(rp.DecodeBlocks)
			// max(used, KVUsage×capacity) when fresh; as a compare, since
			// used (a count) is never NaN or −0.
			if x := rp.KVUsage * capacity; fresh && (x > used || x != x) {
				used = x
			}
			after = used + need
			full = after > highWater*capacity
		}
		if full {
			frac := (after/capacity - highWater) / (1 - highWater)
			memory = frac * tm.prefill(need*bsF, 0)
			if after > capacity {
				ctx := need * bsF
				if rp.InFlight > 0 && rp.DecodeBlocks > 0 {
					ctx = float64(rp.DecodeBlocks*sc.bs) / float64(rp.InFlight)
				}
				memory += tm.prefill(ctx, 0)
			}
		}

		if tm.scaled {
			wait, prefill, decode, memory = wait*tm.scale, prefill*tm.scale, decode*tm.scale, memory*tm.scale
		}
		total := wait + prefill + decode + memory
		if i == pinned && pinBonus > 0 {
			total = max(total-pinBonus, 0)
		}

		if costs != nil {
			costs = costs[:len(costs)+1]
			fill(&costs[len(costs)-1], i, cached, wait, prefill, decode, memory, total)
		}
		maxCached = max(maxCached, cached)
		if best < 0 || total < bestTotal {
			best, bestTotal, bestCached = i, total, cached
		} else if total == bestTotal {
			break
		}
	}
	st.best, st.bestCached, st.maxCached, st.bestTotal, st.costs = best, bestCached, maxCached, bestTotal, costs
	return j
}

// fill writes one candidate's terms, in ns, into c, field by field
// (building a Cost and copying it stalls on store forwarding).
func fill(c *Cost, i, cached int, wait, prefill, decode, memory, total float64) {
	c.Replica, c.Matched = i, cached
	c.Wait, c.Prefill, c.Decode = time.Duration(wait), time.Duration(prefill), time.Duration(decode)
	c.Memory, c.Total = time.Duration(memory), time.Duration(total)
}

// kvScan is one Pick's per-request invariants, and the timing of the last
// replica's Rates, reused while consecutive replicas share them (the usual
// case: one preset).
type kvScan struct {
	p          KVAware // with defaults
	r          *Request
	bs, out    int
	outF       float64 // out as float64
	invBS      float64 // 1 / bs
	staleAfter time.Duration
	pinBonus   float64 // p.PinBonus in ns
	need0      float64 // blocks an unmatched replica allocates: (Tokens + out) / bs
	tm         timing
	prefill0   float64 // prefill of the whole prompt with tm, in ns
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
	sc.tm.set(&Rates{})
	sc.prefill0 = sc.tm.prefill(float64(r.Tokens), 0)
}

// setRates switches sc to rt, a replica's Rates other than the last one's.
// Not inlined: it runs once per Pick in a one-preset fleet.
//
//go:noinline
func (sc *kvScan) setRates(rt *Rates) {
	if sc.tm.sameButScale(rt) {
		sc.tm.setScale(rt) // calibration: the prompt's prefill is unchanged
		return
	}
	sc.tm.set(rt)
	sc.prefill0 = sc.tm.prefill(float64(sc.r.Tokens), 0)
}

// kvChunk is how many replicas' expected cached tokens resident computes
// at a time, ahead of pricing them.
const kvChunk = 64

// resident sets out[j] to the expected cached tokens of the request on
// replica lo+j: p × min(Match×BlockSize, Tokens), p = exp(−Age/Horizon)
// the probability the prefix is still resident (0 without a match). A
// separate loop, so that the exponentials of several replicas overlap.
func (sc *kvScan) resident(rs []Replica, lo int, out []int) {
	match, age, bs, tokens := sc.r.Match, sc.r.Age, sc.bs, sc.r.Tokens
	if lo >= len(match) {
		clear(out)
		return
	}
	match = match[lo:min(lo+len(out), len(match))]
	for j := range out {
		c := 0
		if j < len(match) && match[j] > 0 {
			if m := min(match[j]*bs, tokens); m > 0 {
				a := time.Duration(0)
				if lo+j < len(age) {
					a = age[lo+j]
				}
				p := 1.0 // residency(a, h), inlined
				if h := rs[lo+j].Rates.Horizon; h > 0 && a > 0 {
					p = expNeg(float64(a) / float64(h))
				}
				c = int(p * float64(m))
			}
		}
		out[j] = c
	}
}

// timing is a replica's Rates as float64 nanoseconds with defaults filled,
// with the Rates it was built from (all but Horizon, which it ignores).
type timing struct {
	perTok, attn, step, perSeq, maxSeqs, invSeqs, scale float64
	slot                                                float64 // step + maxSeqs×perSeq: step(MaxSeqs)
	scaled                                              bool    // scale != 1
	// busyAt is the least occupancy with float64(occupancy) − maxSeqs + 1
	// > 0 (the batch is full), so that the scan compares integers.
	busyAt int

	// The Rates fields t was built from.
	prefillPerToken, attnPerToken2, decodeStep, decodePerSeq time.Duration
	maxSeqsKey                                               int
	scaleKey                                                 float64
}

// same reports whether t was built from Rates equal to rt in every field it
// reads. Scale is compared as a float: −0 and 0 give the same timing, and
// a NaN, never equal, only costs a rebuild.
func (t *timing) same(rt *Rates) bool {
	return rt.Scale == t.scaleKey && t.sameButScale(rt)
}

// sameButScale is same, ignoring Scale.
func (t *timing) sameButScale(rt *Rates) bool {
	return rt.PrefillPerToken == t.prefillPerToken && rt.AttnPerToken2 == t.attnPerToken2 &&
		rt.DecodeStep == t.decodeStep && rt.DecodePerSeq == t.decodePerSeq && rt.MaxSeqs == t.maxSeqsKey
}

// set fills t from rt with defaults, as Rates.withDefaults does, in
// float64 (in place: building and copying a struct here costs more than all
// the arithmetic of a Pick).
func (t *timing) set(rt *Rates) {
	t.perTok, t.attn, t.step, t.perSeq, t.maxSeqs, t.invSeqs = float64(DefaultPrefillPerToken),
		float64(DefaultAttnPerToken2)*1e-6, float64(DefaultDecodeStep), float64(DefaultDecodePerSeq),
		DefaultMaxSeqs, 1.0/DefaultMaxSeqs
	if rt.PrefillPerToken > 0 {
		t.perTok = float64(rt.PrefillPerToken)
	}
	if rt.AttnPerToken2 > 0 {
		t.attn = float64(rt.AttnPerToken2) * 1e-6
	}
	if rt.DecodeStep > 0 {
		t.step = float64(rt.DecodeStep)
	}
	if rt.DecodePerSeq > 0 {
		t.perSeq = float64(rt.DecodePerSeq)
	}
	if rt.MaxSeqs > 0 && rt.MaxSeqs != DefaultMaxSeqs {
		t.maxSeqs = float64(rt.MaxSeqs)
		t.invSeqs = 1 / t.maxSeqs
	}
	t.slot = t.step + t.maxSeqs*t.perSeq
	t.busyAt = busyAt(t.maxSeqs)
	t.prefillPerToken, t.attnPerToken2, t.decodeStep, t.decodePerSeq, t.maxSeqsKey =
		rt.PrefillPerToken, rt.AttnPerToken2, rt.DecodeStep, rt.DecodePerSeq, rt.MaxSeqs
	t.setScale(rt)
}

// setScale fills t's scale from rt.Scale (zero or less: 1).
func (t *timing) setScale(rt *Rates) {
	t.scale = 1
	if rt.Scale > 0 {
		t.scale = rt.Scale
	}
	t.scaleKey, t.scaled = rt.Scale, t.scale != 1
}

// busyAt is the least int n with float64(n) − maxSeqs + 1 > 0 (a monotone
// test in n), for maxSeqs an int ≥ 1 as a float64. Up to 2^52 it is
// maxSeqs itself: float64(n) − maxSeqs and + 1 are exact near 0, and far
// from 0 rounding keeps the sign. Beyond, a binary search.
func busyAt(maxSeqs float64) int {
	if maxSeqs >= 1 && maxSeqs <= 1<<52 {
		return int(maxSeqs)
	}
	lo, hi := math.MinInt, math.MaxInt // the test fails at lo and holds at hi
	for lo < hi-1 {
		mid := lo + int(uint64(hi-lo)/2) // hi−lo wraps, as uint64 it is exact
		if float64(mid)-maxSeqs+1 > 0 {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// prefill is the prefill time of n new tokens after c cached, in ns.
func (t *timing) prefill(n, c float64) float64 {
	return n*t.perTok + n*(c+n/2)*t.attn
}

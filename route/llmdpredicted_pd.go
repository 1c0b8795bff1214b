package route

import "time"

// pair is one (prefill worker, decode replica) of LLMDPredicted's pair
// rule, its predictions and headrooms in ms.
type pair struct {
	worker, decode     int
	ttft, tpot         float64 // predicted: the pair's TTFT (overhead included), the decode's TPOT
	ttftRoom, tpotRoom float64 // buffered SLO − predicted
	blend              float64 // TTFTWeight × ttftRoom + TPOTWeight × tpotRoom
}

// meets says both headrooms are positive (the pair optimizer's strict
// test).
func (q *pair) meets() bool { return q.ttftRoom > 0 && q.tpotRoom > 0 }

// pairs is a pair rule in progress over s.
type pairs struct {
	p                *LLMDPredicted
	m                *latencyModel
	r                *Request
	s                *Snapshot
	bs               int
	ttftSLO, tpotSLO float64 // buffered, ms
	overhead         float64 // ms
	alpha, beta      float64
}

// evaluate predicts worker w prefilling for decode replica d.
func (v *pairs) evaluate(w, d int) pair {
	f := Features{Tokens: v.r.Tokens, Cached: ratioOf(v.r, w), Leg: true,
		Prefill: loadOf(&v.s.Replicas[w], v.bs), Serve: loadOf(&v.s.Replicas[d], v.bs)}
	x, y := ttftX(&f), tpotX(&f)
	q := pair{worker: w, decode: d, ttft: v.m.ttft.predict(&x) + v.overhead, tpot: v.m.tpot.predict(&y)}
	q.ttftRoom, q.tpotRoom = v.ttftSLO-q.ttft, v.tpotSLO-q.tpot
	q.blend = v.alpha*q.ttftRoom + v.beta*q.tpotRoom
	return q
}

// each calls fn on every pair, workers major, in index order.
func (v *pairs) each(fn func(q pair)) {
	for w := range v.s.Replicas {
		if !v.s.Replicas[w].Prefills {
			continue
		}
		for d := range v.s.Replicas {
			if v.s.Replicas[d].Healthy {
				fn(v.evaluate(w, d))
			}
		}
	}
}

// pickPair is the pair rule: of the pairs that meet both buffered SLOs
// (or, with probability Explore or when none does, of those that do
// not), one at random in proportion to blend − least blend + 1 ms.
func (p *LLMDPredicted) pickPair(r *Request, s *Snapshot, m *latencyModel) Decision {
	buffer := p.PairBuffer
	if buffer <= 0 || buffer > 1 {
		buffer = 0.9
	}
	v := pairs{p: p, m: m, r: r, s: s, bs: blockSize(s), ttftSLO: buffer * ms(r.SLO.TTFT), tpotSLO: buffer * ms(r.SLO.ITL),
		overhead: ms(orDuration(p.PairOverhead, 5*time.Millisecond))}
	v.alpha, v.beta = p.weights()
	meets, misses := 0, 0
	v.each(func(q pair) {
		if q.meets() {
			meets++
		} else {
			misses++
		}
	})
	if meets+misses == 0 {
		return rejected(r)
	}
	group := meets > 0 && (misses == 0 || unit(Mix64(r.Hash^saltTier)) >= orFraction(p.Explore, 0.01))
	least, total := 0.0, 0.0
	first := true
	v.each(func(q pair) {
		if q.meets() == group && (first || q.blend < least) {
			least, first = q.blend, false
		}
	})
	v.each(func(q pair) {
		if q.meets() == group {
			total += q.blend - least + 1
		}
	})
	draw, chosen := unit(Mix64(r.Hash^saltPair))*total, pair{worker: -1}
	v.each(func(q pair) {
		if q.meets() != group || chosen.worker >= 0 {
			return
		}
		if draw -= q.blend - least + 1; draw <= 0 {
			chosen = q
		}
	})
	if chosen.worker < 0 { // rounding left the draw a hair above the total
		v.each(func(q pair) {
			if q.meets() == group {
				chosen = q
			}
		})
	}
	return v.decision(&chosen, group)
}

// decision routes r to q's decode replica, its prompt prefilled on q's
// worker unless the decode replica already caches what a leg would send
// (as PD decides).
func (v *pairs) decision(q *pair, meets bool) Decision {
	r := v.r
	reason := ReasonNoHeadroom
	if meets {
		reason = ReasonHeadroom
	}
	d := Decision{Replica: q.decode, Reason: reason, Matched: matchOf(r, q.decode) * v.bs, Costs: costsFor(r, 0),
		Miss: v.m.miss(r.SLO, q.ttft, q.tpot)}
	uncached := r.Tokens - min(d.Matched, r.Tokens)
	blocks := max(r.Tokens-1, 0) / v.bs
	if uncached < 1 || blocks*v.bs <= r.Tokens-uncached {
		return d
	}
	d.Transfer = Transfer{From: q.worker, Blocks: blocks, Cached: min(matchOf(r, q.worker)*v.bs, r.Tokens)}
	d.Matched, d.Reason = blocks*v.bs, ReasonDisagg
	return d
}

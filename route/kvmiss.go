package route

import "math"

// PriorSpread is the spread, as a standard deviation of log(observed /
// predicted), that kv-aware takes for a replica's prediction errors until
// the fleet has learned them (Rates.Spread, DecodeSpread): ln 4 / 2 ≈
// 0.69. The calibration treats an observation further than a factor 4
// (its Jump) from the learned scale as a wild one, not a measure of the
// model; taken as the model's two-sigma envelope, that is ln 4 / 2. It
// is wide on purpose: before the router has seen a replica, it should not
// trust a prediction near a bound.
const PriorSpread = math.Ln2

// kvSLO is what the miss term derives of the request's SLO, once per
// Pick (newKVRequest): its bounds in ns (zero: no bound) and the price
// of one of its misses.
type kvSLO struct {
	ttft, itl float64
	// logTTFT and logITL are the bounds' logarithms.
	logTTFT, logITL float64
	// price is what a miss of this request costs, in ns of Total: the
	// latency its SLO allowed it, ttftWeight × TTFT + output × ITL (a
	// bound left zero counts nothing). A request that meets its SLO
	// is worth its latency to the operator wherever under the bound it
	// lands; one that misses is worth nothing, so all of that budget was
	// spent for nothing. The replica's other requests are priced alike at
	// their own output (missPrice).
	price float64
}

// on says the request has an SLO to price.
func (s *kvSLO) on() bool { return s.ttft > 0 || s.itl > 0 }

// newSLO derives the kvSLO of an SLO for a request of out output tokens.
func newSLO(slo SLO, out float64) kvSLO {
	var s kvSLO
	if slo.TTFT > 0 {
		s.ttft = float64(slo.TTFT)
		s.logTTFT = math.Log(s.ttft)
	}
	if slo.ITL > 0 && out >= 2 { // an answer of one token has no inter-token latency
		s.itl = float64(slo.ITL)
		s.logITL = math.Log(s.itl)
	}
	s.price = s.missPrice(out)
	return s
}

// missPrice is what a miss of a request of out output tokens costs under
// these bounds: ttftWeight × TTFT + out × ITL.
func (s *kvSLO) missPrice(out float64) float64 {
	return ttftWeight*s.ttft + out*s.itl
}

// over is the probability that a time predicted at pred ns exceeds a
// bound of log logBound, for a prediction whose error log(observed /
// predicted) is normal with standard deviation sigma: Φ(ln(pred/bound)
// / σ), the normal tail itself (math.Erfc). A prediction at the bound
// misses half the time. Not resident's logistic: the logistic's tail
// falls as e^(−1.7|z|), the normal's as e^(−z²/2), so well under a
// bound, where most candidates are, the logistic says 1.9 times the
// normal's chance at z = −2.3 (a fifth of the bound at the prior spread)
// and 4.5 times at z = −3, and prices misses that will not happen.
func over(pred, logBound, sigma float64) float64 {
	if pred <= 0 {
		return 0
	}
	return math.Erfc((logBound-math.Log(pred))/(sigma*math.Sqrt2)) / 2
}

// spreads is raw's learned spreads, or PriorSpread where one is unknown.
func spreads(raw *Rates) (prefill, decode float64) {
	prefill, decode = raw.Spread, raw.DecodeSpread
	if !(prefill > 0) {
		prefill = PriorSpread
	}
	if !(decode > 0) {
		decode = PriorSpread
	}
	return prefill, decode
}

// kvStall is what a placement does to the decodes on its replica, for
// the miss term: the running batch and its iteration, the prefill
// compute that stalls each of their tokens (stall) and the placement's
// own prefill's, at Scale.
type kvStall struct {
	batch, step    float64 // sequences, and one decode iteration of them at DecodeScale
	stall, compute float64 // prefill compute per output token of theirs (stall), and its own prefill's, at Scale
	grow           float64 // what one more sequence adds to their step, at DecodeScale
	joiners        float64 // the requests expected to join while its prefill runs
}

// stall is the prefill compute, in ns at Scale, that each output token of
// a sequence decoding on replica rp waits for, on average over its
// decode. Chunked prefills run in the same iterations as the decodes, so
// a sequence's mean inter-token latency is its decode step plus the
// prefill compute run on the replica while it decodes, over its output.
// Prefills arrive there at λ with compute c̄ each, a share ρ = λc̄ of the
// replica's time, so each token waits ρ × ITL on average. By Little's
// law the prefill compute of the requests in flight there, done or not
// (Replica.PrefillWork), is P = λc̄T̄, T̄ their mean stay; and their
// number λT̄ over the sum of their 1/n (λ × ITL, each staying n
// iterations) is the harmonic mean output n̄ (harmonic), so T̄ = n̄ × ITL
// and ρ × ITL = P/n̄: the stall per token, whatever a sequence's own
// output. Over the request's decode, the work in flight relaxes to the
// fleet's mean as its context does (lifeContext): persist of P stays,
// the rest is the candidates' mean (meanWork). Its prefill queued ahead
// is part of P. The engine's DecodeScale leaves these stalls out
// (fleet's observeITL takes them off), so the decode's step does not
// count them already. Zero with no prefill in flight anywhere.
func (q *kvRequest) stall(rp *Replica, rt *Rates, batch float64) float64 {
	w := float64(rp.PrefillWork)*q.persist + q.meanWork*(1-q.persist)
	if w <= 0 {
		return 0
	}
	return w * rt.Scale / q.harmonic(rp, batch)
}

// misses is the miss term of a candidate, in ns of Total, and the
// probability that the request misses its SLO there (Cost.Miss):
//
// The request's own: its predicted time to first token ttft (Wait +
// Load|Leg + Prefill) against the TTFT bound, and its mean inter-token
// latency, Decode/output, against the ITL bound, each missed with
// probability over at the replica's spread; it misses when either is,
// taken as independent: 1 − (1 − p_ttft)(1 − p_itl).
//
// The others': each sequence on the replica, and each that joins while
// the prefill runs, decodes at the iteration now plus the stall per
// token of the prefills run beside it (stall). The placement adds its
// own step's share and its prefill's stall, spread over their output (a
// stall of c adds c/n to the mean gap of an answer of n tokens; n the
// batch's harmonic mean output): the extra probability that this pushes
// a sequence over the ITL bound, times the sequences (the joiners at
// half: they meet half the prefill on average), is the others' expected
// misses. The request's own inter-token latency leaves the stall out:
// the prefills that will stall its decode are not yet routed, and each
// of them prices, in its own others' term, the misses it causes here;
// counted in this one's too, the same misses would be priced twice.
//
// Each miss is priced at its request's budget (kvSLO.price), so a
// placement that costs less in the sum but pushes requests over their
// bound loses to one that keeps them under.
func (q *kvRequest) misses(rp *Replica, rt *Rates, ttft, decode float64, st *kvStall) (cost, miss float64) {
	cost, miss = q.ownMisses(&rp.Rates, ttft, decode)
	if pushed := q.pushedMisses(rp, st); pushed > 0 {
		cost += pushed
	}
	return cost, miss
}

// pushedMisses is the others' expected misses of misses, in ns of Total:
// those the placement pushes over their ITL bound, of the sequences on
// replica rp and those that join while its prefill runs (st). Zero or
// less when it pushes none. It grows with st.compute and st.joiners, so
// that at their floors it is a floor (bound).
func (q *kvRequest) pushedMisses(rp *Replica, st *kvStall) float64 {
	s := &q.slo
	if s.itl <= 0 || st.batch+st.joiners <= 0 {
		return 0
	}
	_, sI := spreads(&rp.Rates)
	n := q.harmonic(rp, st.batch)
	before := st.step + st.stall
	after := before + st.grow + st.compute/n
	pushed := over(after, s.logITL, sI) - over(before, s.logITL, sI)
	if pushed <= 0 {
		return 0
	}
	return (st.batch + st.joiners/2) * pushed * s.missPrice(n)
}

// ownMisses is the request's own expected misses, in ns of Total, and
// its probability of a miss, for a predicted time to first token ttft
// and a decode of decode ns on a replica of Rates raw (misses). The
// spreads are read from the replica's own Rates: the cache of rates
// leaves them out, as they matter only to a request with an SLO.
func (q *kvRequest) ownMisses(raw *Rates, ttft, decode float64) (cost, miss float64) {
	sT, sI := spreads(raw)
	s := &q.slo
	pT, pI := 0.0, 0.0
	if s.ttft > 0 {
		pT = over(ttft, s.logTTFT, sT)
	}
	if s.itl > 0 {
		pI = over(decode/q.out, s.logITL, sI)
	}
	miss = 1 - (1-pT)*(1-pI)
	return miss * s.price, miss
}

// missTerms fills k's miss fields and returns total with the miss term
// added, for a request with an SLO (priceWith).
func (q *kvRequest) missTerms(rp *Replica, rt *Rates, k *Cost, total, ttft, decode float64, st *kvStall) float64 {
	cost, miss := q.misses(rp, rt, ttft, decode, st)
	k.Miss, k.Misses = miss, ns(cost)
	total += cost
	k.Total = ns(total)
	return total
}

// The normal tail at a grid of z, for lowMisses: tailLow[k] is at most
// Erfc(z)/2 for every z ≤ tailZ0 + k/tailPerZ, Erfc at that grid point
// lessened by 2⁻³⁰ of itself, far more than math.Erfc's error, so that it
// stays under over's value at any such z. The grid spans ±6, past which
// the tail is within 10⁻¹⁷ of 0 or 1; 64 points a unit of z put each
// within 0.01 of the tail between them (Erfc's slope is at most 2/√π).
const (
	tailZ0, tailZ1 = -6.0, 6.0
	tailPerZ       = 64
)

// Its one point past tailZ1 is for a z just under it whose index rounds up.
var tailLow = func() (t [int((tailZ1-tailZ0)*tailPerZ) + 2]float64) {
	for k := range t {
		t[k] = math.Erfc(tailZ0+float64(k)/tailPerZ) / 2 * (1 - 0x1p-30)
	}
	return t
}()

// lowOver is a lower bound of over(pred, logBound, sigma) that needs no
// Erfc: the tail at the grid point of tailLow at or above its z.
func lowOver(pred, logBound, sigma float64) float64 {
	if pred <= 0 {
		return 0
	}
	z := (logBound - lowLog(pred)) / (sigma * math.Sqrt2) // at least over's
	switch {
	case z >= tailZ1:
		return 0
	case z <= tailZ0:
		return tailLow[0]
	case z != z: // NaN, as over's then is, so that it prunes nothing
		return z
	}
	return tailLow[int((z-tailZ0)*tailPerZ)+1] // a grid point above z
}

// log2Low[k] is at most log₂(1 + k/256): the logarithm of a mantissa
// whose first eight bits are k, less 10⁻¹², far more than math.Log2's
// error.
// Its entry 256 is log₂ 2's, for lowLog's counterpart highLog.
var log2Low = func() (t [257]float64) {
	for k := range t {
		t[k] = math.Log2(1+float64(k)/256) - 1e-12
	}
	return t
}()

// lowLog is a lower bound of ln x, from x's exponent and the first eight
// bits of its mantissa (under 0.004 below ln x), for a normal finite x;
// math.Log for any other.
func lowLog(x float64) float64 {
	if !(x >= 0x1p-1022 && x <= math.MaxFloat64) {
		return math.Log(x)
	}
	b := math.Float64bits(x)
	return (float64(int(b>>52&0x7ff)-1023) + log2Low[b>>44&255]) * math.Ln2
}

// lowMisses is a lower bound of total plus ownMisses' cost, from
// lowOver, for a time to first token of at least ttft and a mean
// inter-token latency of at least itl (decode/output), at the spreads sT
// and sI (spreads), and whether it exceeds above: a candidate that it
// prices out of a scan (bound), ownMisses would too. One tail alone
// often does, which spares the other: the time to first token's first,
// or the decode's with q.itlFirst.
func (q *kvRequest) lowMisses(sT, sI, total, above, ttft, itl float64) (float64, bool) {
	s := &q.slo
	pT, pI := 0.0, 0.0
	if s.itl > 0 && q.itlFirst {
		pI = lowOver(itl, s.logITL, sI)
		if low := total + (1-(1-pI))*s.price; low > above { // as pT's below
			return low, true
		}
	}
	if s.ttft > 0 {
		pT = lowOver(ttft, s.logTTFT, sT)
		// 1 − (1 − pT) is ownMiss's miss at pI = 0, rounded as it rounds
		// it, so that it stays under ownMiss's at any pI.
		if low := total + (1-(1-pT))*s.price; low > above {
			return low, true
		}
	}
	if s.itl > 0 && !q.itlFirst {
		pI = lowOver(itl, s.logITL, sI)
	}
	low := total + (1-(1-pT)*(1-pI))*s.price
	return low, low > above
}

// highLog is an upper bound of ln x, as lowLog's lower: the logarithm of
// the next eight-bit mantissa, plus 10⁻¹².
func highLog(x float64) float64 {
	b := math.Float64bits(x)
	return (float64(int(b>>52&0x7ff)-1023) + log2Low[b>>44&255+1] + 2e-12) * math.Ln2
}

// highOver is an upper bound of over(pred, logBound, sigma) that needs no
// Erfc: the tail at the grid point of tailLow below its z (the last
// below tailZ1 for one past it), raised by more than tailLow lessened it.
func highOver(pred, logBound, sigma float64) float64 {
	if !(pred >= 0x1p-1022 && pred <= math.MaxFloat64) {
		return over(pred, logBound, sigma) // 0, a subnormal, +Inf or NaN
	}
	z := (logBound - highLog(pred)) / (sigma * math.Sqrt2) // at most over's
	x := (z - tailZ0) * tailPerZ
	switch {
	case z != z:
		return z
	case x < 1:
		return 1
	}
	return tailLow[int(min(x, (tailZ1-tailZ0)*tailPerZ))-1] * (1 + 0x1p-28)
}

// highMisses is an upper bound of total plus ownMisses' cost, from
// highOver: a candidate under above by it would be priced (bound) by
// ownMisses too.
func (q *kvRequest) highMisses(raw *Rates, total, ttft, decode float64) float64 {
	sT, sI := spreads(raw)
	pT, pI := 0.0, 0.0
	if q.slo.ttft > 0 {
		pT = highOver(ttft, q.slo.logTTFT, sT)
	}
	if q.slo.itl > 0 {
		pI = highOver(decode/q.out, q.slo.logITL, sI)
	}
	return total + (1-(1-pT)*(1-pI))*q.slo.price
}

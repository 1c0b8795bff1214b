package route

import (
	"math"
	"time"
)

// kvRequest is what the kv-aware cost model derives from the request
// alone, once per Pick.
type kvRequest struct {
	p      KVAware // with defaults
	r      *Request
	bs     int
	tokens float64 // prompt tokens, at least 0
	out    float64 // expected output tokens
	// ctx is the request's mean context while it decodes: prompt +
	// output/2 tokens.
	ctx float64
	// meanBatch and meanContext are the fleet's mean running sequences
	// and their KV context per healthy replica.
	meanBatch, meanContext float64
	// raw and rt cache the last Rates seen with defaults filled, so that
	// a fleet on one preset fills them once per Pick; haveRates says they
	// are set. The fields each replica has its own of (Horizon, the
	// scales, Displaced, the links) are copied at every rates call.
	raw, rt   Rates
	haveRates bool
	// compute0 is the prefill compute of the whole prompt with rt.
	compute0 float64
	// invMean is the fleet's mean 1/output over the router's requests in
	// flight that said their output, m̄ (0: none did); invScale is 1/m̄,
	// or 0 (stalled).
	invMean, invScale float64
	// deepMatch is the deepest match of the prompt, in tokens, on any
	// candidate (copied, turn).
	deepMatch float64
	// arrivals is λ at DecodeScale 1 for rt, per ns (behind).
	arrivals float64
	// persist is the share of a replica's KV context now that is still
	// there on average over the request's decode, (1 − e^{−x})/x for a
	// decode of x = decodeLen sequence lives; perSeq is the fleet's mean
	// context per running sequence (lifeContext).
	persist, perSeq float64
	// decodeLen is the request's decode in units of τ, the time a
	// sequence stays in a batch (kvMeanOutput iterations): out/kvMeanOutput.
	decodeLen float64
	// src is the healthy replica that can send KV (TransferPerMTokens > 0)
	// with the most expected cached tokens, srcCached, computed (Settled);
	// src is −1 when none has a block of the prompt. srcLeg is the
	// prefill leg it would run for an import (legAt).
	src       int
	srcCached float64
	srcWorth  float64 // the source's cached tokens as compute time, less its link's wait
	srcLeg    kvLeg
	// pw is the prefill worker's leg that costs least (prefillWorker);
	// its from is −1 when the fleet has none that can take one.
	pw kvLeg
	// held is the most expected cached tokens of the prompt on any
	// healthy replica: a placement that stores more of the prompt than it
	// has stores a copy of up to that many (Memory's displacement). It is
	// computed when first needed (haveHeld), by a replica that displaces.
	held     float64
	haveHeld bool
	// turns is Request.FutureTurns of a session's first request, else 0,
	// and fleetSeqs the fleet's running sequences (future, kept); holders are
	// the candidates that match the prompt and fresh the age of the
	// freshest match (the time since any of them last served it).
	turns, fleetSeqs float64
	holders          int
	fresh            time.Duration
	reps             []Replica
	// rows are the snapshot's summary (Summary), one per replica: which
	// are candidates, and the fleet's totals.
	rows []summaryRow
	// slo is the request's SLO as the miss term prices it (kvmiss.go).
	slo kvSLO
	// meanWork is the candidates' mean Replica.PrefillWork, in ns at
	// Scale 1 (stall).
	meanWork float64
	// kvBounds is what the pruned scan above kvPruneAbove replicas
	// derives of the request (kvprune.go).
	kvBounds
}

// newKVRequest derives q from r and s, whose replicas sum summarises:
// the fleet's means, a candidate, one preset or several from the
// summary's totals, and the deepest match and the transfer source in one
// pass over the request's matches (matches), appending the hits to
// hits[:0] (which must hold len(s.Replicas); nil: the hits are not
// collected).
func newKVRequest(p KVAware, r *Request, s *Snapshot, sum *Summary, hits []int) kvRequest {
	out := r.MaxTokens
	if out <= 0 {
		out = kvMeanOutput
	}
	tokens := float64(max(r.Tokens, 0))
	q := kvRequest{p: p, r: r, bs: blockSize(s), tokens: tokens, out: float64(out), ctx: tokens + float64(out)/2,
		src: -1, pw: kvLeg{from: -1}, srcLeg: kvLeg{from: -1}, reps: s.Replicas, rows: sum.rows}
	q.first, q.mixed, q.candidates = sum.ref, sum.presetsIn > 1, sum.candidates
	if q.fleetSeqs = s.Seqs; q.fleetSeqs <= 0 {
		q.fleetSeqs = float64(sum.seqs)
	}
	if n := float64(sum.candidates); n > 0 {
		q.meanBatch, q.meanContext = float64(sum.seqs)/n, float64(sum.tokens)/n
	}
	if sum.outputs > 0 && sum.invOutput > 0 {
		q.invMean = float64(sum.invOutput) * 1e-9 / float64(sum.outputs)
		q.invScale = 1 / q.invMean
	}
	if sum.candidates > 0 {
		q.meanWork = float64(sum.work) / float64(sum.candidates)
	}
	matches := r.Match[:min(len(r.Match), len(q.rows))]
	holders := q.readMatches(matches, hits)
	if hits != nil {
		q.tierHits(matches)
	}
	if r.Session != 0 && r.FutureTurns > 0 && r.Pinned < 0 {
		q.turns, q.fresh, q.holders = r.FutureTurns, q.freshest(matches), holders
	}
	q.decodeLen = q.out / float64(kvMeanOutput)
	if !r.SLO.IsZero() {
		q.slo = newSLO(r.SLO, q.out)
	}
	q.persist = 1.0
	if x := q.decodeLen; x > 0 {
		q.persist = (1 - expNeg(x)) / x
	}
	if q.meanBatch > 0 {
		q.perSeq = q.meanContext / q.meanBatch
	}
	q.haveRates = false // source filled the cache before the means were known
	if sum.prefillers > 0 && sum.candidates > 0 {
		q.prefillWorker(float64(sum.candidates))
	}
	if q.src >= 0 {
		q.srcLeg = q.legAt(&q.reps[q.src], q.src, q.srcCached, q.arrivals, 1)
	}
	return q
}

// readMatches reads the candidates' matches of the prompt once: the deepest
// (deepMatch), the transfer source (source), and each holder appended to
// hits[:0] unless hits is nil (q.hits). It returns the holders' number.
func (q *kvRequest) readMatches(matches, hits []int) int {
	collect := hits != nil
	q.hits = hits[:0]
	holders := 0
	for i, m := range matches {
		if m > 0 && q.rows[i].preset >= 0 {
			q.deepMatch = max(q.deepMatch, q.matched(i))
			q.source(&q.reps[i], i)
			holders++
			if collect {
				q.hits = append(q.hits, i)
			}
		}
	}
	return holders
}

// freshest is the age of the freshest of the candidates' matches, the
// time since any of them last served the prompt; −1 when none matches.
func (q *kvRequest) freshest(matches []int) time.Duration {
	fresh := time.Duration(-1)
	for i, m := range matches {
		if m > 0 && q.rows[i].preset >= 0 {
			if a := ageOf(q.r, i); fresh < 0 || a < fresh {
				fresh = a
			}
		}
	}
	return fresh
}

// source makes matched replica i the transfer source if it can send KV
// and is worth more than the source so far: what it caches and has
// computed (Request.Settled), at what computing it would take, less the
// time its link is still busy. Of a hot prefix's holders, the least busy
// links send its imports; a holder still computing the prefix sends none
// of it, and a request behind that first prefill waits for it there or
// computes it elsewhere.
func (q *kvRequest) source(rp *Replica, i int) {
	if rp.Rates.TransferPerMTokens <= 0 {
		return
	}
	rt := q.rates(&rp.Rates)
	c, blocks := q.cached(rp, i, rt), int(q.matched(i))/q.bs
	if i < len(q.r.Settled) && q.r.Settled[i] < blocks { // the rest is still being computed there
		blocks = max(q.r.Settled[i], 0)
		c = min(c, float64(blocks*q.bs))
	}
	worth := c*float64(rt.PrefillPerToken)*rt.Scale - float64(rp.LinkWait)
	if c >= float64(q.bs) && (q.src < 0 || worth > q.srcWorth) {
		q.src, q.srcCached, q.srcWorth = i, c, worth
	}
}

// rates returns raw with defaults filled, from the cache when its shared
// fields equal the last ones'.
func (q *kvRequest) rates(raw *Rates) *Rates {
	if !q.haveRates || !samePreset(raw, &q.raw) {
		q.setRates(raw)
	}
	q.rt.Horizon, q.rt.TierHorizon, q.rt.Scale, q.rt.DecodeScale, q.rt.HitScale = raw.Horizon, raw.TierHorizon, 1, 1, 1
	q.rt.Displaced, q.rt.TransferPerMTokens, q.rt.LoadPerMTokens = raw.Displaced, raw.TransferPerMTokens, raw.LoadPerMTokens
	if raw.HitScale > 0 {
		q.rt.HitScale = raw.HitScale
	}
	if raw.Scale > 0 {
		q.rt.Scale = raw.Scale
	}
	if raw.DecodeScale > 0 {
		q.rt.DecodeScale = raw.DecodeScale
	}
	return &q.rt
}

// samePreset reports whether a and b agree on the fields rates caches:
// all but the learned, per-replica ones.
func samePreset(a, b *Rates) bool {
	return (a.PrefillPerToken^b.PrefillPerToken)|(a.AttnPerMPairs^b.AttnPerMPairs)|
		(a.DecodeStep^b.DecodeStep)|(a.StepOverhead^b.StepOverhead)|(a.DecodePerSeq^b.DecodePerSeq)|
		(a.DecodePerMTokens^b.DecodePerMTokens)|time.Duration(a.MaxSeqs^b.MaxSeqs)|
		time.Duration(a.MaxBatchedTokens^b.MaxBatchedTokens) == 0
}

// setRates fills the cache of rates from raw: once per Pick on a fleet of
// one preset, so out of the inlined path.
//
//go:noinline
func (q *kvRequest) setRates(raw *Rates) {
	q.raw, q.rt, q.haveRates = *raw, raw.WithDefaults(), true
	q.compute0 = q.rt.prefillNS(q.tokens, 0)
	meanStep := q.rt.stepNS(q.meanBatch, q.meanContext)
	q.arrivals = q.meanBatch / (float64(kvMeanOutput) * meanStep)
	q.setBounds()
}

// cached is the expected cached prompt tokens on replica i: the index's
// match, at most the prompt, times the probability it is still resident
// when the prefill starts, taken at two points of its age profile when
// the request says where it changes (Request.Fresh): the warm leading
// part at its age, the rest at the match's. Both ages run on by the
// queue's wait for the prefill ahead (queueNS of queuedTokens, the
// compute alone, as Backlog's): the blocks must outlast it, while the
// misses of the requests queued there are stored.
func (q *kvRequest) cached(rp *Replica, i int, rt *Rates) float64 {
	m := q.matched(i)
	if m <= 0 {
		return 0
	}
	capacity := float64(rp.CacheBlocks) * float64(q.bs)
	var queued time.Duration
	if rt.Horizon > 0 {
		queued = ns(min(rt.queueNS(queuedTokens(rp, isFresh(rp, kvStaleAfter), q.tokens), 0, 1), 1<<62)) // an age plus it cannot wrap
	}
	p := resident(ageOf(q.r, i)+queued, rt.Horizon, capacity, q.tokens)
	if i < len(q.r.Fresh) && q.r.Fresh[i] > 0 && p < 1 {
		warm := min(float64(q.r.Fresh[i]*q.bs), m)
		pw := 1.0
		if i < len(q.r.FreshAge) {
			pw = resident(q.r.FreshAge[i]+queued, rt.Horizon, capacity, q.tokens)
		}
		p = (warm*max(pw, p) + (m-warm)*p) / m
	}
	return math.Floor(min(p*rt.HitScale, 1) * m)
}

// matched is the prompt tokens the index matched on replica i.
func (q *kvRequest) matched(i int) float64 {
	return min(float64(matchOf(q.r, i)*q.bs), q.tokens)
}

// tiered is the expected prompt tokens replica i holds on its GPU or its
// CPU tier: the index's match times the probability it is still on the
// replica at TierHorizon over both tiers' capacity, with the learned
// HitScale; 0 without a tier. Where the working set cycles through the
// GPU cache (LRU's worst case) but fits the tiers, cached predicts
// almost nothing while the engine loads most prompts without computing.
func (q *kvRequest) tiered(rp *Replica, i int, rt *Rates) float64 {
	m := q.matched(i)
	if m <= 0 || rt.TierHorizon <= 0 {
		return 0
	}
	// The tokens the churn allocates over TierHorizon, as the GPU's
	// capacity is over Horizon: the scale of resident's step.
	capacity := float64(rp.CacheBlocks) * float64(q.bs) * float64(rt.TierHorizon) / float64(max(rt.Horizon, 1))
	p := resident(ageOf(q.r, i), rt.TierHorizon, capacity, q.tokens)
	return math.Floor(min(p*rt.HitScale, 1) * m)
}

// ns converts float64 nanoseconds to a Duration, saturating: a request
// asking for a billion output tokens prices beyond what a Duration holds,
// and must read as the longest one, not wrap to a negative.
func ns(x float64) time.Duration {
	if x >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(x)
}

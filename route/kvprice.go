package route

import (
	"math"
	"slices"
	"sync"
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
	// compute0 is the prefill compute of the whole prompt with rt, and
	// computeDeep that of the prompt after the deepest match of any
	// replica, the least any replica's prefill can cost (bound).
	compute0, computeDeep float64
	// iters0 is the iterations a prefill of the whole prompt takes with rt.
	iters0    float64
	deepMatch float64
	// arrivals is λ at DecodeScale 1 for rt, per ns (behind).
	arrivals float64
	// persist is the share of a replica's KV context now that is still
	// there on average over the request's decode, (1 − e^{−x})/x for a
	// decode of x = decodeLen sequence lives; perSeq is the fleet's mean
	// context per running sequence (lifeContext).
	persist, perSeq float64
	// decodeFloor is the least decode and decode slowdown of others the
	// request can cost on a replica of rt with no KV context, unscaled;
	// outPerToken what each token of the replica's averaged context adds
	// to its decode (bound, quick).
	decodeFloor, outPerToken float64
	// first is a candidate (a healthy replica), or −1; candidates is
	// their number.
	first, candidates int
	// computes is the compute of the prompt that bounds a prefill's on
	// each path of quickTerms (screen sets it).
	computes [4]float64
	// mixed says the healthy replicas' Rates differ in more than their
	// learned fields (Horizon, the scales, ...): a fleet of several
	// presets, which quick cannot price from one.
	mixed bool
	// decodeLen is the request's decode in units of τ, the time a
	// sequence stays in a batch (MeanOutput iterations): out/MeanOutput.
	decodeLen float64
	// src is the healthy replica that can send KV (TransferPerMTokens > 0)
	// with the most expected cached tokens, srcCached, of the srcBlocks
	// its index matched; src is −1 when none has a block of the prompt.
	src       int
	srcCached float64
	srcBlocks int
	srcWorth  float64 // the source's cached tokens as compute time, less its link's wait
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
	// rows are the snapshot's summary (Summary), one per replica.
	rows []summaryRow
	// hits are the candidates whose prompt's prefill may cost less than
	// the whole prompt's (path): those that match it or whose CPU tier
	// holds some, in replica order, so that a scan of every replica need
	// not read the request's matches.
	hits []int
}

// newKVRequest derives q from r and s, whose replicas sum summarises:
// the fleet's means, a candidate, one preset or several from the
// summary's totals, and the deepest match and the transfer source in one
// pass over the request's matches, appending the hits to hits[:0]
// (which must hold len(s.Replicas); nil: the hits are not collected).
func newKVRequest(p KVAware, r *Request, s *Snapshot, sum *Summary, hits []int) kvRequest {
	p = p.withDefaults()
	out := r.MaxTokens
	if out <= 0 {
		out = p.MeanOutput
	}
	tokens := float64(max(r.Tokens, 0))
	q := kvRequest{p: p, r: r, bs: blockSize(s), tokens: tokens, out: float64(out), ctx: tokens + float64(out)/2,
		src: -1, reps: s.Replicas, rows: sum.rows}
	q.first, q.mixed, q.candidates = sum.ref, sum.presetsIn > 1, sum.candidates
	if q.fleetSeqs = s.Seqs; q.fleetSeqs <= 0 {
		q.fleetSeqs = float64(sum.seqs)
	}
	if n := float64(sum.candidates); n > 0 {
		q.meanBatch, q.meanContext = float64(sum.seqs)/n, float64(sum.tokens)/n
	}
	matches, tiers := r.Match[:min(len(r.Match), len(q.rows))], r.Offloaded[:min(len(r.Offloaded), len(q.rows))]
	collect := hits != nil
	q.hits = hits[:0]
	holders := 0
	for i, m := range matches {
		if m > 0 && q.rows[i].preset >= 0 {
			q.deepMatch = max(q.deepMatch, q.matched(i))
			q.source(&s.Replicas[i], i)
			holders++
			if collect {
				q.hits = append(q.hits, i)
			}
		}
	}
	if collect && len(tiers) > 0 {
		for i, n := range tiers {
			if n > 0 && q.rows[i].preset >= 0 && (i >= len(matches) || matches[i] <= 0) {
				q.hits = append(q.hits, i)
			}
		}
		slices.Sort(q.hits)
	}
	if r.Session != 0 && r.FutureTurns > 0 && r.Pinned < 0 {
		q.turns, q.fresh, q.holders = r.FutureTurns, -1, holders
		for i, m := range matches {
			if m > 0 && q.rows[i].preset >= 0 {
				if a := ageOf(r, i); q.fresh < 0 || a < q.fresh {
					q.fresh = a
				}
			}
		}
	}
	q.decodeLen = q.out / float64(p.MeanOutput)
	q.persist = 1.0
	if x := q.decodeLen; x > 0 {
		q.persist = (1 - expNeg(x)) / x
	}
	if q.meanBatch > 0 {
		q.perSeq = q.meanContext / q.meanBatch
	}
	q.haveRates = false // source filled the cache before the means were known
	return q
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
		q.src, q.srcCached, q.srcWorth, q.srcBlocks = i, c, worth, blocks
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
	q.compute0 = prefillNS(&q.rt, q.tokens, 0)
	q.computeDeep = prefillNS(&q.rt, q.tokens-q.deepMatch, q.deepMatch)
	q.iters0 = math.Ceil(max(q.tokens, 1) / float64(q.rt.MaxBatchedTokens))
	grow := float64(q.rt.DecodePerSeq) + q.ctx*float64(q.rt.DecodePerMTokens)*1e-6
	q.decodeFloor = q.out * (stepNS(&q.rt, q.meanBatch, 0) + grow + q.meanBatch*grow)
	q.outPerToken = q.out * float64(q.rt.DecodePerMTokens) * 1e-6
	meanStep := stepNS(&q.rt, q.meanBatch, q.meanContext)
	q.arrivals = q.meanBatch / (float64(q.p.MeanOutput) * meanStep)
}

// price is the kv-aware cost model of one candidate (KVAware's doc says
// what each term is): its terms and their total, in float64 nanoseconds.
// It is the cheaper of computing what the replica does not cache and,
// when the transfer source caches more, importing that first (import).
func (q *kvRequest) price(rp *Replica, i int) (Cost, float64) {
	rt := q.rates(&rp.Rates)
	cached := q.cached(rp, i, rt)
	k, total := q.priceWith(rp, i, rt, cached, cached, 0, Transfer{})
	if imp, ok := q.importing(rp, i, rt, cached); ok {
		if k2, t2 := q.priceWith(rp, i, rt, cached, q.srcCached, 0, imp); t2 < total {
			k, total = k2, t2
		}
	}
	if tier, load, ok := q.loading(rp, i, rt, cached); ok {
		if k2, t2 := q.priceWith(rp, i, rt, cached, tier, load, Transfer{}); t2 < total {
			k, total = k2, t2
		}
	}
	return k, total
}

// loading is what replica i's CPU tier holds of the prompt beyond the
// cached tokens on its GPU, in tokens, and the time it takes to load it;
// ok is false when that is less than a block or the tier earns no credit.
// What the tier holds is the engine's own word where its KV events say
// it (Request.Offloaded), else the index's match expected still on the
// replica at TierHorizon (tiered).
func (q *kvRequest) loading(rp *Replica, i int, rt *Rates, cached float64) (tier, load float64, ok bool) {
	if rt.LoadPerMTokens <= 0 {
		return 0, 0, false
	}
	if i < len(q.r.Offloaded) {
		tier = min(float64(q.r.Offloaded[i]*q.bs), q.tokens)
	}
	if tier == 0 {
		tier = q.tiered(rp, i, rt)
	}
	if tier-cached < float64(q.bs) {
		return 0, 0, false
	}
	return tier, (tier - cached) * float64(rt.LoadPerMTokens) * 1e-6, true
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

// importing is the transfer of the source's cached prefix to replica i,
// which caches local tokens of it: the tokens it lacks cross the slower
// of the two replicas' links, after what either link still carries. ok
// is false when there is no source, it is i, either cannot transfer, or
// it caches less than a block more. It is priced on the tokens expected
// cached, but orders every block the source's index matched: the source
// sends what it still holds (each block is resident or not, not a share
// of it), and an order cut to the expected share would leave the rest
// to be computed where the source has it.
func (q *kvRequest) importing(rp *Replica, i int, rt *Rates, local float64) (Transfer, bool) {
	if q.src < 0 || q.src == i || rt.TransferPerMTokens <= 0 {
		return Transfer{}, false
	}
	missing := q.srcCached - local
	if missing < float64(q.bs) {
		return Transfer{}, false
	}
	src := &q.reps[q.src]
	per := float64(max(rt.TransferPerMTokens, src.Rates.TransferPerMTokens))
	t := missing*per*1e-6 + float64(max(rp.LinkWait, src.LinkWait))
	return Transfer{From: q.src, Blocks: q.srcBlocks, Time: ns(t)}, true
}

// priceWith prices replica i with local tokens of the prompt cached on its
// GPU and cached ones cached when the prefill starts: more than local
// when imp brings them, in imp.Time before it, or its CPU tier does, in
// load.
func (q *kvRequest) priceWith(rp *Replica, i int, rt *Rates, local, cached, load float64, imp Transfer) (Cost, float64) {
	fresh := rp.Scraped && rp.LoadAge <= q.p.StaleAfter
	uncached := q.tokens - cached
	compute := q.compute0 // this prefill's compute
	if cached > 0 {
		compute = prefillNS(rt, uncached, cached)
	}

	// The running batch: its size and KV context, and one iteration now;
	// and averaged over the request's decode (q.life, q.lifeContext),
	// during which the batch relaxes to the fleet's mean and the context
	// its sequences hold now leaves as they finish.
	batch, context := q.batch(rp, fresh)
	step := stepNS(rt, batch, context)
	life := q.life(batch, q.kept(rp))
	lifeStep := stepNS(rt, life, q.lifeContext(batch, context, life))
	grow := float64(rt.DecodePerSeq) + q.ctx*float64(rt.DecodePerMTokens)*1e-6
	budget := float64(rt.MaxBatchedTokens)

	// Wait: the rest of the iteration under way, the prefill queued
	// ahead, in iterations that also step the running decodes, and a
	// seat when every seat is taken.
	queued := q.queued(rp, fresh)
	wait := queued*float64(rt.PrefillPerToken)*rt.Scale + queued/budget*step*rt.DecodeScale
	if batch > 0 && queued == 0 {
		// A decoding engine admits it at its next iteration: half of the
		// one under way remains, on average, when it arrives. (Behind a
		// queue, the queue's iterations count that one.)
		wait += step / 2 * rt.DecodeScale
	}
	if seats, occupied := float64(rt.MaxSeqs), q.occupancy(rp, fresh); occupied >= seats {
		// A seat frees every out × step(MaxSeqs) / MaxSeqs on average.
		over := occupied - seats + 1
		full := stepNS(rt, seats, context/max(batch, 1)*seats)
		wait += over * q.out * full / seats * rt.DecodeScale
	}

	// Prefill: its compute, in ⌈uncached/budget⌉ iterations (a decode
	// step each, or the step overhead on an idle replica). An import or
	// a load runs before it, on a link, not the GPU: it delays this
	// request's tokens but stalls nobody. The engine starts it when it
	// admits the request and computes the rest at the first iteration
	// after it lands: on a decoding replica, half a step later on
	// average; an idle one starts that iteration when it lands.
	iter := iterNS(rt, batch, context) * rt.DecodeScale
	prefill := compute*rt.Scale + math.Ceil(max(uncached, 1)/budget)*iter
	if (imp.Blocks > 0 || load > 0) && batch > 0 {
		wait += step / 2 * rt.DecodeScale
	}

	// Decode: its own output, one iteration per token.
	decode := q.out * (lifeStep + grow) * rt.DecodeScale

	// Others: the stall of the running decodes, the slowdown of the
	// sequences that share its iterations, and the wait of the requests
	// that arrive during its prefill.
	others := batch*compute*rt.Scale + life*q.out*grow*rt.DecodeScale + 2*q.behind(rt, wait, prefill)

	// Memory: KV pressure (imported blocks take room too), and the copy
	// of what another replica holds that this placement stores: computed
	// or imported, past what this replica had on its GPU or CPU tier.
	own := local
	if load > 0 {
		own = cached
	}
	memory := (q.memory(rp, rt, fresh, q.tokens-local) + q.displaced(rt, own)) * rt.Scale
	future := q.future(rp, i, rt) - q.shared(rt, max(own, cached))
	total := 2*(wait+float64(imp.Time)+load+prefill) + decode + others + memory + future
	if i == q.r.Pinned && q.p.PinBonus > 0 {
		total = max(total-float64(q.p.PinBonus), 0)
	}
	return Cost{Replica: i, Matched: int(cached), Wait: ns(wait), Prefill: ns(prefill),
		Decode: ns(decode), Others: ns(others), Memory: ns(memory), Future: ns(future),
		Total: ns(total), Import: imp, Load: ns(load)}, total
}

// future is what the session's later turns cost on replica i: they follow
// this request there, where its context is cached, so a placement
// decides theirs too (Request.FutureTurns of them). A later turn comes
// after the batches of now have turned over: it meets not this batch
// but the one the replica keeps, its arrival rate times a sequence's
// stay by Little's law, which is its share of the router's requests
// (Replica.Share) of the fleet's running sequences (Snapshot.Seqs).
// Each turn pays turn at that mean. Zero for a request without a
// session.
func (q *kvRequest) future(rp *Replica, i int, rt *Rates) float64 {
	if q.turns <= 0 {
		return 0
	}
	return q.turns * q.turn(rt, rp.ShareAt(q.r.Seq, len(q.reps))*q.fleetSeqs)
}

// shared is the part of a new session's first request's prefill that
// the sessions after it share. A copy of the prefix the holders cache
// (what the prompts all start with, a system prompt), computed on a
// replica that has own tokens of it when the prefill starts (imported
// or loaded ones are not computed), serves every later session that
// starts there while it stays. Those arrive at ν = λ/(1 + F): λ ≈ 1/age
// is the rate at which the prefix is asked for (its freshest holder's
// match is age old) and 1/(1 + F) the share of requests that begin a
// session (F = Request.FutureTurns). A new holder takes its part,
// 1/(holders + 1), of them for as long as the copy stays, its eviction
// horizon (none: a day). Of the N sessions that share the copy, this
// one pays 1/(1 + N): shared is the rest of the copy's prefill, in its
// time to first token, counted twice as Total counts it.
func (q *kvRequest) shared(rt *Rates, own float64) float64 {
	if q.turns <= 0 || q.holders == 0 {
		return 0
	}
	copied := q.copied(own)
	if copied <= 0 {
		return 0
	}
	stay := rt.Horizon
	if stay <= 0 {
		stay = 24 * time.Hour
	}
	age := max(q.fresh, time.Millisecond)
	n := float64(stay) / float64(age) / (1 + q.turns) / float64(q.holders+1)
	return 2 * prefillNS(rt, copied, own) * rt.Scale * n / (1 + n)
}

// turn is the latency one turn of this request's size pays, and imposes,
// on a replica whose batch averages b: a batch of independent arrivals
// that each stay a while holds a Poisson number of sequences (M/G/∞),
// so with probability 1 − e^{−b} the turn finds it decoding, b/(1 −
// e^{−b}) sequences on average, and waits half an iteration and carries
// them in its prefill's; else it runs alone. It then decodes its output
// beside b others, each of whose tokens it slows, and its prefill (the
// part no replica caches) stalls their decodes. Both latencies count
// its time to first token.
func (q *kvRequest) turn(rt *Rates, b float64) float64 {
	busy, ttft := 1-expNeg(b), float64(rt.StepOverhead)
	if busy > 0 {
		n := b / busy
		step := stepNS(rt, n, n*q.perSeq)
		ttft = busy*(step/2+step) + (1-busy)*ttft
	}
	grow := float64(rt.DecodePerSeq) + q.ctx*float64(rt.DecodePerMTokens)*1e-6
	decode := q.out * (stepNS(rt, b, b*q.perSeq) + grow + b*grow)
	stall := b * prefillNS(rt, max(q.tokens-q.deepMatch, 0), q.deepMatch)
	return (2*ttft+decode)*rt.DecodeScale + stall*rt.Scale
}

// kept is the batch replica rp keeps at its share of the router's
// arrivals (Replica.Share of the fleet's running sequences, by Little's
// law), and at least the fleet's mean: the batch it relaxes to (life).
// A replica whose requests return to it (a conversation's turns follow
// its cached context) keeps drawing them however large its batch grows;
// only the arrivals the router steers can be steered away.
func (q *kvRequest) kept(rp *Replica) float64 {
	return max(q.meanBatch, rp.ShareAt(q.r.Seq, len(q.reps))*q.fleetSeqs)
}

// life is the replica's batch averaged over the request's decode, for a
// replica that keeps a batch of target (kept) at its share of the
// arrivals. A replica below it draws the arrivals the router steers to
// it, the fleet's rate times the replicas, and is at it almost at once.
// One above it goes on drawing its share, target/τ (τ the time a
// sequence stays in a batch), while its B sequences finish at B/τ: its
// excess e = B − target decays as de/dt = −e/τ, and its mean over a
// decode of D = decodeLen·τ is e₀ × (1 − e^{−D/τ})/(D/τ), q.persist of
// it. (Were its arrivals to stop, as the router's steering alone would
// have it, the excess would drain by the target's rate too; the turns of
// the conversations it holds, and the prefixes only it caches, keep
// them coming.) The target is at least the fleet's mean batch, which
// bound and quick rely on.
func (q *kvRequest) life(batch, target float64) float64 {
	if e0 := batch - target; e0 > 0 {
		return target + e0*q.persist
	}
	return target
}

// lifeContext is the replica's KV context, in tokens, averaged over the
// request's decode, its batch averaging life. The context its sequences
// hold now leaves only as they finish, each at rate 1/τ whatever the
// arrivals do: on average over the decode, q.persist of it is still
// there. The sequences that join to make up the average batch bring the
// fleet's mean context per sequence (q.perSeq). So a replica of a few
// long contexts stays dear for a long decode, and one of short contexts
// stays cheap, where counting only its batch would price both at the
// fleet's mean.
func (q *kvRequest) lifeContext(batch, context, life float64) float64 {
	return context*q.persist + max(life-batch*q.persist, 0)*q.perSeq
}

// lowContext is a lower bound of lifeContext for any batch average
// (life is at least the fleet's mean batch): bound's and quick's.
func (q *kvRequest) lowContext(batch, context float64) float64 {
	return context*q.persist + max(q.meanBatch-batch*q.persist, 0)*q.perSeq
}

// behind is the wait a prefill of the given length, starting after wait,
// imposes on the requests that arrive at the replica after it: they
// arrive at the replica's rate λ. Those that arrive while it waits queue
// behind it and wait for all of it; those that arrive while it runs wait,
// on average, for the half still to run (the engine serves running
// prefills first): λ × prefill × (wait + prefill/2). So a prefill the
// request could have skipped (a prefix another replica caches) costs
// most where the queue is long: near capacity, every request behind it
// pays for it. λ is the fleet's per-replica arrival rate by Little's law:
// the mean batch over the time a sequence stays in it, MeanOutput
// iterations of the mean batch.
func (q *kvRequest) behind(rt *Rates, wait, prefill float64) float64 {
	return q.arrivals / rt.DecodeScale * prefill * (wait + prefill/2)
}

// cached is the expected cached prompt tokens on replica i: the index's
// match, at most the prompt, times the probability it is still resident,
// taken at two points of its age profile when the request says where it
// changes (Request.Fresh): the warm leading part at its age, the rest at
// the match's.
func (q *kvRequest) cached(rp *Replica, i int, rt *Rates) float64 {
	m := q.matched(i)
	if m <= 0 {
		return 0
	}
	capacity := float64(rp.CacheBlocks) * float64(q.bs)
	p := resident(ageOf(q.r, i), rt.Horizon, capacity, q.tokens)
	if i < len(q.r.Fresh) && q.r.Fresh[i] > 0 && p < 1 {
		warm := min(float64(q.r.Fresh[i]*q.bs), m)
		pw := 1.0
		if i < len(q.r.FreshAge) {
			pw = resident(q.r.FreshAge[i], rt.Horizon, capacity, q.tokens)
		}
		p = (warm*max(pw, p) + (m-warm)*p) / m
	}
	return math.Floor(min(p*rt.HitScale, 1) * m)
}

// matched is the prompt tokens the index matched on replica i.
func (q *kvRequest) matched(i int) float64 {
	return min(float64(matchOf(q.r, i)*q.bs), q.tokens)
}

// batch is the replica's sequences, the batch a request sent there
// joins (those still in prefill run beside it too), and their KV context
// in tokens (batchOf).
func (q *kvRequest) batch(rp *Replica, fresh bool) (n, context float64) {
	return batchOf(rp, fresh, q.bs)
}

// queued is the prompt tokens queued ahead of the request: the router's
// own not yet prefilled, and when fresh metrics show more waiting
// requests than the router's own undecided ones, the others at the size
// of the router's queued ones (or of this request).
func (q *kvRequest) queued(rp *Replica, fresh bool) float64 {
	tokens := float64(rp.PrefillTokens)
	own := max(rp.InFlight-rp.Decoding, 0)
	if extra := rp.Waiting - own; fresh && extra > 0 {
		per := q.tokens
		if own > 0 {
			per = float64(rp.PrefillTokens) / float64(own)
		}
		tokens += float64(extra) * per
	}
	return tokens
}

// occupancy is the requests holding or awaiting a seat: the router's own
// in flight, or the engine's running and waiting when fresh and more.
func (q *kvRequest) occupancy(rp *Replica, fresh bool) float64 {
	n := rp.InFlight
	if fresh {
		n = max(n, rp.Running+rp.Waiting)
	}
	return float64(n)
}

// memory is the unscaled cost of KV pressure: the blocks the request
// takes (uncached prompt and output), pushing usage above HighWater,
// evict cached prefixes others would reuse, and above capacity a running
// sequence is preempted and recomputed. Usage is in blocks, or the
// engine's fraction when the capacity is unknown.
func (q *kvRequest) memory(rp *Replica, rt *Rates, fresh bool, uncached float64) float64 {
	hw, bs := q.p.HighWater, float64(q.bs)
	need := (uncached + q.out) / bs
	capacity, after := float64(rp.CacheBlocks), 0.0
	if capacity <= 0 {
		if !fresh || !(rp.KVUsage > hw) { // NaN says nothing
			return 0
		}
		capacity, after = 1, rp.KVUsage
	} else {
		used := float64(rp.DecodeBlocks)
		if fresh {
			if u := rp.KVUsage; u > 0 { // not NaN
				used = max(used, u*capacity)
			}
		}
		after = used + need
		if after <= hw*capacity {
			return 0
		}
	}
	cost := max((after/capacity-hw)/(1-hw), 0) * prefillNS(rt, need*bs, 0)
	if after > capacity {
		ctx := need * bs
		if rp.InFlight > 0 && rp.DecodeBlocks > 0 {
			ctx = float64(rp.DecodeBlocks) * bs / float64(rp.InFlight)
		}
		cost += prefillNS(rt, ctx, 0)
	}
	return cost
}

// displaced is the unscaled cost of the tokens a placement evicts to
// store a copy of what another replica holds: the tokens of the prompt
// the best holder has expected beyond own (what this replica has, on its
// GPU or, when it loads them, its CPU tier), each evicting a token that
// is asked for again with probability Displaced, whose prefill the next
// request pays in its time to first token and so in both latencies.
//
// Every token a placement stores evicts one once the cache is full, but
// a new token is worth about what it evicts, so only a copy is a loss to
// the fleet: its hits are ones the holder would give anyway, save the
// balancing the queue and batch terms already price. Going to the holder
// copies nothing; a recompute or an import elsewhere copies the prefix.
func (q *kvRequest) displaced(rt *Rates, own float64) float64 {
	if rt.Displaced <= 0 {
		return 0
	}
	copied := q.copied(own)
	if copied <= 0 {
		return 0
	}
	return (2 + q.meanBatch) * rt.Displaced * prefillNS(rt, copied, 0)
}

// copied is the tokens of the best holder's expected cached prefix
// (held) that a placement with own of them stores anew; 0 when it has
// as many.
func (q *kvRequest) copied(own float64) float64 {
	if q.deepMatch <= own {
		return 0
	}
	if !q.haveHeld {
		q.held, q.haveHeld = q.holds(), true
	}
	return max(q.held-own, 0)
}

// holds is the most expected cached tokens of the prompt on any healthy
// replica (held). It prices with its own copy of the rates cache, since
// its caller holds a pointer into q's.
func (q *kvRequest) holds() float64 {
	c := kvRequest{p: q.p, r: q.r, bs: q.bs, tokens: q.tokens}
	most := 0.0
	for i := range q.reps[:min(len(q.r.Match), len(q.reps))] {
		if rp := &q.reps[i]; rp.Healthy && matchOf(q.r, i) > 0 {
			most = max(most, c.cached(rp, i, c.rates(&rp.Rates)))
		}
	}
	return most
}

// bound is a lower bound of price's total for replica i. It keeps the
// terms that tell replicas apart cheaply: the queue ahead and the running
// batch, as price has them; the prefill's compute as if the deepest match
// of any replica were cached here (exact when nothing matches here and
// nothing can be imported or loaded), in at least one iteration of that
// batch, its stall of the batch and the wait of the arrivals behind it;
// the decode at its floor, the fleet's mean batch (a replica's batch over
// a decode is never below it: see life) and lowContext. Each term of price
// is at least its counterpart here (a seat's wait, an import's or a
// load's time and memory only add; a new session's later turns add, and
// the share of its copy they take back is at most the prefill of the
// holders' prefix, which the deepest match leaves out), so a candidate
// whose bound exceeds a priced one's Total cannot win.
func (q *kvRequest) bound(rp *Replica, i int) float64 {
	rt := q.rates(&rp.Rates)
	compute, iters := q.compute0, q.iters0
	switch {
	case i < len(q.r.Offloaded) && q.r.Offloaded[i] > 0:
		compute, iters = 0, 1 // its CPU tier may hold more than any GPU
	case matchOf(q.r, i) > 0 || q.src >= 0 || q.turns > 0:
		// It may import the source's prefix, or share most of its copy's
		// prefill with the sessions after this one (shared).
		compute, iters = q.computeDeep, 1
	}
	fresh := rp.Scraped && rp.LoadAge <= q.p.StaleAfter
	batch, context := q.batch(rp, fresh)
	step := stepNS(rt, batch, context) * rt.DecodeScale
	queued := q.queued(rp, fresh)
	wait := queued*float64(rt.PrefillPerToken)*rt.Scale + queued/float64(rt.MaxBatchedTokens)*step
	prefill := compute*rt.Scale + iters*iterNS(rt, batch, context)*rt.DecodeScale
	decode := q.decodeFloor + q.outPerToken*q.lowContext(batch, context)
	total := 2*(wait+prefill) + decode*rt.DecodeScale + batch*compute*rt.Scale + 2*q.behind(rt, wait, prefill)
	if i == q.r.Pinned && q.p.PinBonus > 0 {
		total = max(total-float64(q.p.PinBonus), 0)
	}
	return total
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
}

var screens = sync.Pool{New: func() any { return new(screen) }}

// summary is s's Summary when it carries one kept for p, or sc's own
// filled from s.
func (sc *screen) summary(p KVAware, s *Snapshot) *Summary {
	stale := p.withDefaults().StaleAfter
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
// take from its summary row: the decode at its floor, the prefill's
// compute as bound takes it, twice and once for each sequence it stalls,
// and the router's own queue ahead of it, twice. It takes q.rt's preset
// fields for the replica's, so it holds only on a fleet of one preset
// (!q.mixed), once screen has set q.computes.
func (q *kvRequest) quick(i int) float64 {
	t := &q.rows[i]
	return (q.decodeFloor+q.outPerToken*q.lowContext(t.batch, t.context))*t.decodeScale +
		q.computes[q.path(i)&3]*t.stall + t.queue
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
	if q.src >= 0 || q.turns > 0 {
		// Every replica may import the source's prefix, or, for a new
		// session, have most of its copy's prefill shared (shared).
		whole = q.computeDeep
	}
	q.computes = [4]float64{pathWhole: whole, pathDeep: q.computeDeep, pathTier: 0}
	best, least := q.first, math.Inf(1)
	// quick, for every row, with what it reads of q hoisted: the same
	// operations in the same order (TestKVAwarePruningMatchesFullPricing
	// compares the two).
	// Every row as if its prefill were the whole prompt's (a row that is
	// not a candidate has an infinite queue, so its bound is too), then
	// the hits on their own paths.
	floor, perToken, persist, mean, perSeq := q.decodeFloor, q.outPerToken, q.persist, q.meanBatch, q.perSeq
	quick, rows := sc.quick[:len(q.rows)], q.rows
	for i := range quick {
		t := &rows[i]
		short := mean - t.batch*persist // lowContext's, with its max as a branch
		if short < 0 {
			short = 0
		}
		low := t.context*persist + short*perSeq
		quick[i] = (floor+perToken*low)*t.decodeScale + whole*t.stall + t.queue
	}
	for _, i := range q.hits {
		quick[i] = q.quick(i)
	}
	for i, lb := range quick { // apart: the loops above carry nothing
		if lb < least {
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

// ns converts float64 nanoseconds to a Duration, saturating: a request
// asking for a billion output tokens prices beyond what a Duration holds,
// and must read as the longest one, not wrap to a negative.
func ns(x float64) time.Duration {
	if x >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(x)
}

// prefillNS is the compute time of n new tokens after c cached, in ns.
func prefillNS(rt *Rates, n, c float64) float64 {
	return n*float64(rt.PrefillPerToken) + n*(c+n/2)*float64(rt.AttnPerMPairs)*1e-6
}

// stepNS is one decode iteration of n sequences holding context tokens of
// KV, in ns.
func stepNS(rt *Rates, n, context float64) float64 {
	return float64(rt.DecodeStep) + n*float64(rt.DecodePerSeq) + context*float64(rt.DecodePerMTokens)*1e-6
}

// iterNS is one iteration that carries a prefill on a replica of n
// sequences holding context tokens, beside the prefill's compute: a decode
// step of them, or on an idle replica (n = 0) the step overhead alone,
// since nothing decodes (engine.Engine's iteration time).
func iterNS(rt *Rates, n, context float64) float64 {
	if n <= 0 {
		return float64(rt.StepOverhead)
	}
	return stepNS(rt, n, context)
}

// The kv-aware cost model (KVAware): the price of sending the request to
// one candidate replica, in float64 nanoseconds of the fleet's latency,
// the request's time to first and to last token plus what it adds to the
// others'. One line per term, each with the function that prices it:
//
//	Total   = ttftWeight·(Wait + Load|Leg + Prefill) + Decode + Others + Memory + Future + Misses   priceWith
//	Wait    = queued·PrefillPerToken·Scale + queued/MaxBatchedTokens·step·DecodeScale         queueNS, queuedTokens, stepNS
//	          + step/2 on a decoding replica with nothing queued, again after a Load|Leg
//	          + a seat's wait when all are taken: over·out·step(MaxSeqs)/MaxSeqs              seat, occupied
//	          + KV room when the blocks in use and its exceed the capacity: over/used·n̄·step     room, harmonic
//	Load    = (tier − cached)·LoadPerMTokens, the CPU tier's tokens over PCIe                 loading, tiered
//	Leg     = max(the source's wait and prefill of the prompt, LinkWait)                     withLeg, legAt
//	          + (sent − cached)·TransferPerMTokens; the source is a prefill worker (prefillWorker) or, for an import,
//	          the replica that holds most of the prefix (source); Others gains the leg's
//	          stall of the source's decodes and ttftWeight·behind there
//	Prefill = compute(uncached after cached)·Scale + ⌈uncached/MaxBatchedTokens⌉·iter         cached, prefillNS, iterNS
//	          cached = match·resident(age + queued·PrefillPerToken·Scale), the blocks outlasting the
//	          queue's compute ahead (Wait's first term)                                          resident, queueNS
//	Decode  = out·(step(life, lifeContext) + Δ)·DecodeScale                                   life, kept, lifeContext
//	Others  = B'·compute·Scale + life·out·Δ·DecodeScale + ttftWeight·behind                   stalled, behind
//	          B' = B × (the batch's mean 1/output) / (the fleet's), per token
//	Memory  = (memory + displaced)·Scale, displaced = (ttftWeight + B̄)·Displaced·copy         memory, displaced, copied, holds
//	Future  = future − shared, future = FutureTurns·turn(kept batch)                          future, turn, shared
//	Misses  = P(miss)·(ttftWeight·SLO.TTFT + out·SLO.ITL)                                   misses, over, kvSLO.price
//	          + (B + joiners/2)·[Φ(itl′) − Φ(itl)]·(ttftWeight·SLO.TTFT + n̄·SLO.ITL), 0 without an SLO
//	          P(miss) = 1 − (1 − Φ(TTFT))(1 − Φ(ITL)), TTFT = Wait + Load|Leg + Prefill, ITL = Decode/out
//	          itl = step + stall, itl′ = itl + Δ + compute/n̄, joiners = λ·Prefill
//	          stall = (P·persist + P̄·(1 − persist))·Scale/n̄, the prefill run per output token  stall
//	          Φ(x) = P(x·e^ε > bound), ε ~ N(0, Spread²) (DecodeSpread for ITLs)    spreads, PriorSpread
//
// with B and K the replica's batch and its KV context (batch), step =
// stepNS(B, K), Δ what one more sequence of this request adds to a step,
// B̄ the fleet's mean batch, n̄ the harmonic mean output of the batch,
// λ the per-replica arrival rate, P the prefill compute of the router's
// requests in flight on the replica (Replica.PrefillWork) and P̄ the
// candidates' mean of it, persist the share of the replica's state that
// lasts through the request's decode (lifeContext), and Load, a holder's Leg, a prefill
// worker's Leg or none, whichever of the four placements prices least
// (price). kvprune.go bounds Total
// from below to skip candidates on a large fleet; this file does not
// know of it.

package route

import (
	"math"
	"time"
)

// ttftWeight is how many times a request's time to first token counts
// in Total: it is part of both its time to first token and its time to
// last, and so are the waits its prefill imposes on others (behind,
// displaced, shared, turn; kvprune.go's bounds and the Summary's rows).
const ttftWeight = 2

// price is the kv-aware cost model of one candidate (KVAware's doc says
// what each term is): its terms and their total, in float64 nanoseconds.
// It is the cheapest of computing what the replica does not cache;
// loading what its CPU tier holds (loading); and having a source compute
// the prompt and send its KV (withLeg): the prefill worker whose leg
// costs least, or the replica that caches most of the prefix (an import).
func (q *kvRequest) price(rp *Replica, i int) (Cost, float64) {
	rt := q.rates(&rp.Rates)
	cached := q.cached(rp, i, rt)
	k, total := q.priceWith(rp, i, rt, cached, cached, 0, Transfer{})
	if tier, load, ok := q.loading(rp, i, rt, cached); ok {
		if k2, t2 := q.priceWith(rp, i, rt, cached, tier, load, Transfer{}); t2 < total {
			k, total = k2, t2
		}
	}
	if q.srcCached-cached >= float64(q.bs) { // an import brings a block or more
		k, total = q.withLeg(&q.srcLeg, rp, i, rt, cached, k, total)
	}
	return q.withLeg(&q.pw, rp, i, rt, cached, k, total)
}

// withLeg is k, of total, or the price of replica i, which caches local
// tokens of the prompt, with the prompt computed by leg l's source when
// that is less. The blocks the source holds then, all the prompt's but
// the last token's (which the decode replica computes, as vLLM's decode
// worker does), less those replica i caches, cross the slower of the two
// links. So its running decodes are
// not stalled by the prompt, and the request pays the leg and the
// transfer, and the others the leg's cost to the source's requests.
// The links carry what they carry already while the source computes:
// the blocks leave when both the leg and the links are done. There is no
// leg without a source, from i itself, or when the replica already caches
// what would be sent.
func (q *kvRequest) withLeg(l *kvLeg, rp *Replica, i int, rt *Rates, local float64, k Cost, total float64) (Cost, float64) {
	if l.from < 0 || l.from == i || rt.TransferPerMTokens <= 0 {
		return k, total
	}
	blocks := max(int(q.tokens)-1, 0) / q.bs
	sent := float64(blocks * q.bs)
	if sent-local < float64(q.bs) {
		return k, total
	}
	src := &q.reps[l.from]
	per := float64(max(rt.TransferPerMTokens, src.Rates.TransferPerMTokens))
	t := max(l.time, float64(max(rp.LinkWait, src.LinkWait))) + (sent-local)*per*1e-6
	leg := Transfer{From: l.from, Blocks: blocks, Time: ns(t), Cached: int(l.cached)}
	k2, t2 := q.priceWith(rp, i, rt, local, sent, 0, leg)
	if t2 += l.others; t2 >= total {
		return k, total
	}
	k2.Others += ns(l.others)
	k2.Total = ns(t2)
	return k2, t2
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

// priceWith prices replica i with local tokens of the prompt cached on its
// GPU and cached ones cached when the prefill starts: more than local
// when imp brings them, in imp.Time before it, or its CPU tier does, in
// load.
func (q *kvRequest) priceWith(rp *Replica, i int, rt *Rates, local, cached, load float64, imp Transfer) (k Cost, total float64) {
	fresh := isFresh(rp, kvStaleAfter)
	uncached := q.tokens - cached
	compute := q.compute0 // this prefill's compute
	if cached > 0 {
		compute = rt.prefillNS(uncached, cached)
	}

	// The running batch: its size and KV context, and one iteration now;
	// and averaged over the request's decode (q.life, q.lifeContext),
	// during which the batch relaxes to the fleet's mean and the context
	// its sequences hold now leaves as they finish.
	batch, context := q.batch(rp, fresh)
	step := rt.stepNS(batch, context)
	life := q.life(batch, q.kept(rp))
	lifeStep := rt.stepNS(life, q.lifeContext(batch, context, life))
	grow := float64(rt.DecodePerSeq) + q.ctx*float64(rt.DecodePerMTokens)*1e-6
	budget := float64(rt.MaxBatchedTokens)

	// Wait: the rest of the iteration under way, the prefill queued
	// ahead, in iterations that also step the running decodes, and a
	// seat when every seat is taken.
	queued := queuedTokens(rp, fresh, q.tokens)
	wait := rt.queueNS(queued, step, rt.DecodeScale)
	if batch > 0 && queued == 0 {
		// A decoding engine admits it at its next iteration: half of the
		// one under way remains, on average, when it arrives. (Behind a
		// queue, the queue's iterations count that one.)
		wait += step / 2 * rt.DecodeScale
	}
	wait += q.seat(rp, rt, fresh, batch, context) + q.room(rp, fresh, batch, q.tokens-local+q.out, step)*rt.DecodeScale

	// Prefill: its compute, in ⌈uncached/budget⌉ iterations (a decode
	// step each, or the step overhead on an idle replica). An import or
	// a load runs before it, on a link, not the GPU: it delays this
	// request's tokens but stalls nobody. The engine starts it when it
	// admits the request and computes the rest at the first iteration
	// after it lands: on a decoding replica, half a step later on
	// average; an idle one starts that iteration when it lands.
	iter := rt.iterNS(batch, context) * rt.DecodeScale
	prefill := compute*rt.Scale + math.Ceil(max(uncached, 1)/budget)*iter
	if (imp.Blocks > 0 || load > 0) && batch > 0 {
		wait += step / 2 * rt.DecodeScale
	}

	// Decode: its own output, one iteration per token.
	decode := q.out * (lifeStep + grow) * rt.DecodeScale

	// Others: the stall of the running decodes, the slowdown of the
	// sequences that share its iterations, and the wait of the requests
	// that arrive during its prefill.
	others := q.stalled(rp, batch)*compute*rt.Scale + life*q.out*grow*rt.DecodeScale + ttftWeight*q.behind(rt, wait, prefill)

	// Memory: KV pressure (imported blocks take room too), and the copy
	// of what another replica holds that this placement stores: computed
	// or imported, past what this replica had on its GPU or CPU tier.
	own := local
	if load > 0 {
		own = cached
	}
	memory := (q.memory(rp, rt, fresh, q.tokens-local) + q.displaced(rt, own)) * rt.Scale
	future := q.future(rp, i, rt) - q.shared(rt, max(own, cached))
	total = ttftWeight*(wait+float64(imp.Time)+load+prefill) + decode + others + memory + future
	k = Cost{Replica: i, Matched: int(cached), Wait: ns(wait), Prefill: ns(prefill),
		Decode: ns(decode), Others: ns(others), Memory: ns(memory), Future: ns(future),
		Total: ns(total), Import: imp, Load: ns(load)}
	if q.slo.on() {
		st := kvStall{batch: batch, step: step * rt.DecodeScale, stall: q.stall(rp, rt, batch),
			compute: compute * rt.Scale, grow: grow * rt.DecodeScale, joiners: q.arrivals / rt.DecodeScale * prefill}
		total = q.missTerms(rp, rt, &k, total, wait+float64(imp.Time)+load+prefill, decode, &st)
	}
	return k, total
}

// seat is the wait for one of replica rp's seats (Rates.MaxSeqs) when
// all are taken, its batch of sequences holding context tokens: one frees
// every out × step(MaxSeqs) / MaxSeqs on average.
func (q *kvRequest) seat(rp *Replica, rt *Rates, fresh bool, batch, context float64) float64 {
	seats, taken := float64(rt.MaxSeqs), float64(occupied(rp, fresh))
	if taken < seats {
		return 0
	}
	full := rt.stepNS(seats, context/max(batch, 1)*seats)
	return (taken - seats + 1) * q.out * full / seats * rt.DecodeScale
}

// room is the wait for KV room on replica rp, whose batch of sequences
// takes a step per token, for need more tokens (the request's uncached
// prompt and its output): vLLM admits a request only when its blocks are
// free, so where the blocks in use and these exceed the capacity, it waits
// for the running sequences to free the excess as they finish. A sequence
// of n output tokens finishes at 1/n per step, freeing its blocks, so the
// batch frees a share 1/n̄ of the blocks in use per step, n̄ the harmonic
// mean output of its sequences (harmonic), and an excess of a share x of
// them is free after x × n̄ steps. Zero with the capacity unknown.
func (q *kvRequest) room(rp *Replica, fresh bool, batch, need, step float64) float64 {
	capacity := float64(rp.CacheBlocks)
	used := usedBlocks(rp, fresh)
	over := used + need/float64(q.bs) - capacity
	if capacity <= 0 || used <= 0 || over <= 0 {
		return 0
	}
	return over / used * q.harmonic(rp, batch) * step
}

// harmonic is the harmonic mean output, in tokens, of replica rp's batch
// of sequences: the router's requests that said their output length at
// theirs (Replica.InvOutput), the others at kvMeanOutput.
func (q *kvRequest) harmonic(rp *Replica, batch float64) float64 {
	told := float64(min(rp.Outputs, int(batch)))
	inv := (batch - told) / float64(kvMeanOutput)
	if told > 0 && rp.InvOutput > 0 {
		inv += rp.InvOutput * told / float64(rp.Outputs)
	}
	if inv <= 0 {
		return float64(kvMeanOutput)
	}
	return batch / inv
}

// usedBlocks is the KV blocks in use on replica rp: the router's
// footprint of its requests there (prompt and expected output), or the
// engine's usage when fresh and more.
func usedBlocks(rp *Replica, fresh bool) float64 {
	used := float64(rp.DecodeBlocks)
	if u := rp.KVUsage; fresh && u > 0 { // not NaN
		used = max(used, u*float64(rp.CacheBlocks))
	}
	return used
}

// batch is the replica's sequences, the batch a request sent there
// joins (those still in prefill run beside it too), and their KV context
// in tokens (batchOf).
func (q *kvRequest) batch(rp *Replica, fresh bool) (n, context float64) {
	return batchOf(rp, fresh, q.bs)
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

// kept is the batch replica rp keeps at its share of the router's
// arrivals (Replica.Share of the fleet's running sequences, by Little's
// law), and at least the fleet's mean: the batch it relaxes to (life).
// A replica whose requests return to it (a conversation's turns follow
// its cached context) keeps drawing them however large its batch grows;
// only the arrivals the router steers can be steered away.
func (q *kvRequest) kept(rp *Replica) float64 {
	return max(q.meanBatch, rp.ShareAt(q.r.Seq, len(q.reps))*q.fleetSeqs)
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

// stalled is the weight of the stall a prefill imposes on replica rp's
// batch of sequences, in sequences of the fleet's mean: a stall of c
// lengthens each inter-token gap of a sequence of n output tokens by c/n
// on average, so it matters to each per token, and a batch of short
// answers (whose mean inter-token latency one stall can break) is dearer
// to stall than one of long answers. Priced per token at the fleet's
// harmonic mean output 1/m̄, each sequence weighs its own 1/n over m̄:
// batch × (the replica's mean 1/n) / m̄, over the router's requests that
// said their output length (Replica.Outputs); over the fleet the weights
// sum to its sequences. Without those, the batch.
func (q *kvRequest) stalled(rp *Replica, batch float64) float64 {
	if q.invMean <= 0 || rp.Outputs <= 0 || rp.InvOutput <= 0 {
		return batch
	}
	return batch * rp.InvOutput / float64(rp.Outputs) * q.invScale
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
// the mean batch over the time a sequence stays in it, kvMeanOutput
// iterations of the mean batch.
func (q *kvRequest) behind(rt *Rates, wait, prefill float64) float64 {
	return q.arrivals / rt.DecodeScale * prefill * (wait + prefill/2)
}

// memory is the unscaled cost of KV pressure: the blocks the request
// takes (uncached prompt and output), pushing usage above kvHighWater,
// evict cached prefixes others would reuse, and above capacity a running
// sequence is preempted and recomputed. Usage is in blocks, or the
// engine's fraction when the capacity is unknown.
func (q *kvRequest) memory(rp *Replica, rt *Rates, fresh bool, uncached float64) float64 {
	hw, bs := kvHighWater, float64(q.bs)
	need := (uncached + q.out) / bs
	capacity, after := float64(rp.CacheBlocks), 0.0
	if capacity <= 0 {
		if !fresh || !(rp.KVUsage > hw) { // NaN says nothing
			return 0
		}
		capacity, after = 1, rp.KVUsage
	} else {
		after = usedBlocks(rp, fresh) + need
		if after <= hw*capacity {
			return 0
		}
	}
	cost := max((after/capacity-hw)/(1-hw), 0) * rt.prefillNS(need*bs, 0)
	if after > capacity {
		ctx := need * bs
		if rp.InFlight > 0 && rp.DecodeBlocks > 0 {
			ctx = float64(rp.DecodeBlocks) * bs / float64(rp.InFlight)
		}
		cost += rt.prefillNS(ctx, 0)
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
	return (ttftWeight + q.meanBatch) * rt.Displaced * rt.prefillNS(copied, 0)
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
	return ttftWeight * rt.prefillNS(copied, own) * rt.Scale * n / (1 + n)
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
		step := rt.stepNS(n, n*q.perSeq)
		ttft = busy*(step/2+step) + (1-busy)*ttft
	}
	grow := float64(rt.DecodePerSeq) + q.ctx*float64(rt.DecodePerMTokens)*1e-6
	decode := q.out * (rt.stepNS(b, b*q.perSeq) + grow + b*grow)
	stall := b * rt.prefillNS(max(q.tokens-q.deepMatch, 0), q.deepMatch)
	return (ttftWeight*ttft+decode)*rt.DecodeScale + stall*rt.Scale
}

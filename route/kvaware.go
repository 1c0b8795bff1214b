package route

import "time"

// KVAware is kvrouter's default policy. It prices every candidate replica
// in one unit, time, and sends the request where the fleet's total latency
// grows least. A user waits twice, for the first token and for the last,
// so a request's latency is counted as its time to first token plus its
// time to last token; the policy minimises the sum of that over the fleet:
// the request's own, plus what it adds to the requests on that replica.
// Pricing the whole request and its cost to the others (rather than its
// own time to first token) is what keeps a replica that holds a prefix
// from drawing every request that shares it: its growing batch slows
// every one of its decodes, and each new prefill stalls them all.
//
// For replica i, with B its sequences (every request the router has in
// flight there, or the engine's Running when fresh and more) and K their
// KV context in tokens, one decode iteration takes step = DecodeStep + B×DecodePerSeq +
// K×DecodePerMTokens, and one more sequence like this request adds
// Δ = DecodePerSeq + (prompt + output/2)×DecodePerMTokens to it. Then:
//
//   - Matched: the expected cached prompt tokens, p × the index's match, p
//     the probability the prefix is still resident (resident: a smoothed
//     step at the replica's eviction horizon). An approximate match's age
//     is its deepest block's; when that is old but other requests have
//     since touched a leading part of it (a shared context under an old
//     conversation, Request.Fresh), that part is priced at its own age.
//   - Wait, until its prefill starts: on a replica that decodes with
//     nothing queued, the rest of the iteration under way (step/2 on
//     average: the engine admits requests between iterations); else the
//     prefill queued ahead of it (the
//     router's own and, from fresh metrics, the engine's other waiting
//     requests), each of whose iterations also carries the running
//     decodes; when the engine's seats are all taken, a seat's
//     expected time to free; and when its KV blocks in use (the router's
//     footprint of its requests, or the engine's usage) and the
//     request's exceed its capacity, the time its sequences take to free
//     the excess as they finish (kvRequest.room): vLLM admits a request
//     only when its blocks are free.
//   - Prefill: its uncached tokens after the cached ones (with the
//     attention term), and the iterations that carry them: a decode step
//     each, or on an idle replica only Rates.StepOverhead, since nothing
//     else runs in them.
//   - Decode: its own output, output × (step + Δ), with the batch and
//     its context averaged over its decode: the router steers arrivals
//     towards the lighter replicas, so a batch below the fleet's mean is
//     soon at it, and one above drains as its sequences finish
//     (kvRequest.life), down to the batch its share of the arrivals
//     keeps (kvRequest.kept: the turns of the conversations it holds
//     return to it however large it grows); the context its sequences hold leaves only as
//     they finish, replaced by the fleet's mean context per sequence
//     (kvRequest.lifeContext).
//   - Others: the delay it imposes: its prefill stalls each of the B
//     running decodes (B × its prefill compute), which their last tokens
//     feel, and which matters to each per token: a stall of c adds c/n to
//     each inter-token gap of an answer of n tokens on average, so each
//     stalled sequence weighs its 1/n over the fleet's mean 1/n
//     (kvRequest.stalled, over the requests that said their max_tokens;
//     the weights sum to the fleet's sequences) and a batch of short
//     answers is dear to stall, one of long answers cheap; its presence slows every iteration it shares with the batch
//     (its batch over the decode, kvRequest.life, × output × Δ); and the requests that queue behind it
//     while it waits wait for all of its prefill, and those that arrive
//     while it runs for half (λ × prefill × (Wait + prefill/2), λ the
//     fleet's per-replica arrival rate: the mean batch over the time a
//     sequence stays in it, by Little's law; kvRequest.behind), for
//     their first token and so for their last.
//   - Memory: with u the KV usage after admitting its blocks, above
//     HighWater it evicts cached prefixes others would reuse ((u −
//     HighWater)/(1 − HighWater) × the prefill of the blocks it takes);
//     above 1 a running sequence is preempted and recomputed. And a
//     placement that stores a copy of what another replica caches (it
//     computes or imports the prefix the best holder has) evicts as many
//     tokens, each asked for again with the replica's measured
//     probability Rates.Displaced, and its recompute counts in the next
//     request's time to first token, twice, and stalls the fleet's mean
//     batch B̄: (2 + B̄) × Displaced × the copy's prefill (displaced).
//     A token stored that no replica has is worth about what it evicts;
//     a copy's hits are the holder's anyway, save the balancing the
//     other terms price. On a cache that has yet to evict, or under
//     little pressure, Displaced is 0 and copies are free.
//   - Future, for the first request of a session whose requests extend
//     each other (Request.FutureTurns > 0, a conversation): its later
//     turns follow it to where its context is cached, so the placement
//     is theirs too. Each is priced at the batch the replica keeps, not
//     the one of now: its share of the router's requests (Replica.Share)
//     of the fleet's average running sequences (Snapshot.Seqs), found
//     decoding with probability 1 − e^{−batch} (kvRequest.turn). Less
//     the part of a copy of the holders' prefix (a system prompt) that
//     the later sessions starting on this replica will share while it
//     stays (kvRequest.shared): a copy of a prefix every session asks for
//     costs the one that makes it little, and one seldom asked for
//     nearly all of it.
//
// The prefix a replica lacks need not be computed here. Each candidate
// is priced four ways and keeps the cheapest: computing what its GPU
// does not cache; loading what its CPU tier holds past that over PCIe
// (Request.Offloaded where the engine's events say it, else the match
// expected still on the replica at Rates.TierHorizon, kvRequest.tiered;
// Rates.LoadPerMTokens: Cost.Load); and having another replica compute
// the prompt in a prefill leg and send its KV (Cost.Import,
// Decision.Transfer), as the router runs a transfer on the wire (vLLM's
// NixlConnector: the source computes the whole prompt as a request of one
// token and holds its blocks for the decode replica to read). The leg's
// source is, for an import, the replica that caches and has computed most
// of the prefix (Request.Settled), or in a disaggregated fleet the prefill
// worker (Replica.Role RolePrefill) whose leg costs least, with its own
// prefix cache (kvRequest.prefillWorker). A leg waits in its source's
// queue, computes what the source does not cache in iterations with the
// source's running decodes, which it stalls, and delays the requests
// that arrive there after it (kvRequest.legAt); its blocks, less those
// the candidate caches, cross the slower of the two links after what
// either still carries (Rates.TransferPerMTokens, Replica.LinkWait). A
// load or a transfer delays the request's first token (twice in the
// total, as Wait does) but runs on a link, not the candidate's GPU: it
// stalls none of the candidate's decodes, which is why it can win even
// where it takes longer than the prefill it spares. Where it does not
// win, the holder's own price (go there and wait) or a recompute does;
// an import that makes a hot prefix resident on a second replica is also
// a replication, and one from a holder with a long queue or a large
// batch to stall loses to both. In a disaggregated fleet a decision
// from a prefill worker says ReasonDisagg; where computing locally prices
// less (a short prompt, an idle decode replica, a busy worker), it says
// ReasonLocalPrefill: Dynamo's conditional disaggregation, where the
// price crosses rather than at a threshold.
//
// Total = 2 × (Wait + Load or Leg + Prefill) + Decode + Others + Memory
// + Future (kvmodel.go's formula block, one line per term), Others
// counting the arrivals' wait twice too: a time to first token is part of
// both latencies (ttftWeight). Wait, Prefill and the prefill stall are prefill work and
// scale with Rates.Scale; Decode, the decode slowdown and the decode
// iterations inside Wait and Prefill scale with Rates.DecodeScale. Wait +
// Prefill is the predicted time to first token (Needs.Calibrate).
//
// The behaviours of docs/kv-aware.md fall out of these terms, each covered by
// a test in kvaware_test.go: a session's replica holds its blocks, so its
// match keeps the session there until another replica's lighter batch
// saves more than recomputing the context costs; a hot prefix's holder
// grows a batch whose cost to everyone on it exceeds one prefill of the
// prefix elsewhere, and a second holder is made (ReasonReplicate); a
// request that arrives behind its prefix's first prefill waits for it
// rather than computing it again; old entries decay; a nearly full
// replica pays Memory.
//
// Unhealthy replicas are never candidates; none healthy → Replica −1 with
// ReasonNoHealthy. Scraped metrics with !Scraped or LoadAge > StaleAfter
// are ignored: only the router's own counts are used. Ties go to the
// pinned replica, then to the lowest tieKey of Request.Hash.
type KVAware struct {
	// StaleAfter is the age beyond which scraped engine metrics are ignored;
	// zero means 1 s (ten default scrape intervals).
	StaleAfter time.Duration
	// HighWater is the KV usage fraction, 0..1, above which the memory term
	// starts; zero means 0.9.
	HighWater float64
	// MeanOutput is the expected output length in tokens when
	// Request.MaxTokens is zero; zero means 256.
	MeanOutput int
	// Precise asks the caller for a KV-event index; false means approximate.
	Precise bool
}

// Needs asks for a residency index, approximate unless Precise, and a
// Summary of the snapshots.
func (p KVAware) Needs() Needs {
	n := Needs{Index: Approximate, Calibrate: true, Summarize: true, StaleAfter: p.withDefaults().StaleAfter}
	if p.Precise {
		n.Index = Precise
	}
	return n
}

// withDefaults fills p's zero fields.
func (p KVAware) withDefaults() KVAware {
	if p.StaleAfter <= 0 {
		p.StaleAfter = time.Second
	}
	if p.HighWater <= 0 || p.HighWater >= 1 {
		p.HighWater = 0.9
	}
	if p.MeanOutput <= 0 {
		p.MeanOutput = 256
	}
	return p
}

// Pick prices every healthy replica with price and keeps the cheapest. Up
// to kvPruneAbove replicas every candidate is priced in full; above, a
// candidate whose lower bound already exceeds the cheapest Total found is
// counted in Decision.Pruned instead of priced (see quick and bound),
// which leaves the decision unchanged
// (TestKVAwarePruningMatchesFullPricing). What it derives of the replicas
// alone it reads from the snapshot's Summary when the caller keeps one
// (the fleet does), else derives it. Pick allocates nothing.
func (p KVAware) Pick(r *Request, s *Snapshot) Decision {
	return p.pick(r, s, len(s.Replicas) > kvPruneAbove)
}

// pick is Pick, pruning with the bounds if prune: every candidate priced
// in turn, or the pruned scan (kvChoice.scanPruned).
func (p KVAware) pick(r *Request, s *Snapshot, prune bool) Decision {
	sc := screens.Get().(*screen)
	defer screens.Put(sc)
	prune = prune && r.Tokens >= 0
	var hits []int // collected for the pruned scan, in sc's buffer of one per replica
	if prune {
		sc.size(len(s.Replicas))
		hits = sc.hits[:0]
	}
	q := newKVRequest(p, r, s, sc.summary(p, s), hits)
	c := kvChoice{best: -1, costs: costsFor(r, len(s.Replicas))}
	switch {
	case !prune:
		for i := range s.Replicas {
			if rp := &s.Replicas[i]; rp.Healthy {
				k, total := q.price(rp, i)
				c.record(k)
				c.consider(&q, i, &k, total)
			}
		}
	case q.first >= 0:
		c.scanPruned(&q, sc)
	}
	return c.decision(&q)
}

// kvChoice is a pick's cheapest candidate so far, best (−1: none), its
// Total and what it caches and imports; the priced candidates' costs
// when the request records them; and what the reason needs of the
// others: the most any priced one caches locally (maxCached), and the
// deepest match of those pruned (maxPruned, pruned of them). Its methods
// take the kvRequest rather than hold it: a pointer beside costs, which
// append may grow, would move the request to the heap.
type kvChoice struct {
	costs                        []Cost
	best                         int
	total                        float64
	cached                       int
	imp                          Transfer
	maxCached, maxPruned, pruned int
}

// price prices candidate i, records its cost and considers it.
func (c *kvChoice) price(q *kvRequest, i int) {
	k, total := q.price(&q.reps[i], i)
	c.record(k)
	c.consider(q, i, &k, total)
}

// record appends k to the costs when the request records them.
func (c *kvChoice) record(k Cost) {
	if c.costs != nil {
		c.costs = append(c.costs, k)
	}
}

// consider makes candidate i, priced k at total, the best if it is
// cheaper, or as cheap and first in a tie (tieBefore).
func (c *kvChoice) consider(q *kvRequest, i int, k *Cost, total float64) {
	local := k.Matched // what it caches on its GPU, as deepest counts
	if k.Import.Blocks > 0 || k.Load > 0 {
		rp := &q.reps[i]
		local = int(q.cached(rp, i, q.rates(&rp.Rates)))
	}
	c.maxCached = max(c.maxCached, local)
	if c.best < 0 || total < c.total || total == c.total && q.p.tieBefore(q.r, i, c.best) {
		c.best, c.total, c.cached, c.imp = i, total, k.Matched, k.Import
	}
}

// decision is the Decision for the best candidate, and its reason.
func (c *kvChoice) decision(q *kvRequest) Decision {
	if c.best < 0 {
		return Decision{Replica: -1, Reason: ReasonNoHealthy, Costs: c.costs, Pruned: c.pruned}
	}
	if c.maxPruned > c.cached {
		c.maxCached = max(c.maxCached, q.deepest(q.reps, c.cached))
	}
	reason := kvReason(q.r, c.best, c.cached, c.maxCached, q.bs)
	switch {
	case c.imp.Blocks > 0 && q.reps[c.imp.From].Role == RolePrefill:
		reason = ReasonDisagg
	case c.imp.Blocks > 0:
		reason = ReasonTransfer
	case q.pw.from >= 0:
		reason = ReasonLocalPrefill
	}
	return Decision{Replica: c.best, Reason: reason, Matched: c.cached, Costs: c.costs, Transfer: c.imp, Pruned: c.pruned}
}

// tieBefore reports whether i wins an exact tie against j.
func (KVAware) tieBefore(r *Request, i, j int) bool {
	if i == r.Pinned || j == r.Pinned {
		return i == r.Pinned
	}
	return tieKey(r.Hash, i) < tieKey(r.Hash, j)
}

// kvReason names why best won: its session, its prefix, a new holder of a
// prefix another replica holds more of (replicate), or plain least cost.
func kvReason(r *Request, best, cached, maxCached, bs int) string {
	switch {
	case best == r.Pinned && matchOf(r, best) > 0:
		return ReasonSession
	case cached >= bs && cached >= maxCached:
		return ReasonPrefix
	case maxCached >= bs && maxCached > cached:
		return ReasonReplicate
	}
	return ReasonLeastCost
}

var (
	_ Policy = KVAware{}
	_ Needer = KVAware{}
)

package route

import "time"

// KVAware is kvrouter's default policy. It prices every candidate replica
// in one unit, time, and sends the request where the price is least: the
// fleet's latency the placement adds (the request's time to first token,
// counted twice as it is part of both latencies, and to its last token,
// plus what it adds to the other requests' on that replica), and, for a
// request with an SLO, its expected misses of it priced in time. The
// model is stated once, one line per term naming the function that
// prices it, in kvmodel.go's formula block; docs/kv-aware.md shows the
// same formula (a test holds the two to the same terms) and says why
// each term is what it is.
//
// Pricing the whole request and its cost to the others (rather than its
// own time to first token) is what keeps a replica that holds a prefix
// from drawing every request that shares it: its growing batch slows
// every one of its decodes, and each new prefill stalls them all. A sum
// of latencies, though, is linear, and attainment of an SLO is a
// threshold on each request: a sum accepts a placement that pushes a few
// requests over their bound when it saves more time elsewhere. The miss
// term (kvmiss.go) prices that: the probability that the request, and
// each request on the replica (and those that join while its prefill
// runs), misses its bound, from the model's predictions and the spread
// of its own prediction errors (Rates.Spread, DecodeSpread). Without an
// SLO it is zero, and the latency alone decides.
//
// Each candidate is priced four ways, keeping the cheapest: computing
// what its GPU does not cache, loading what its CPU tier holds (Load),
// or having another replica compute the prompt in a prefill leg and send
// its KV (Leg): the holder of most of the prefix (an import,
// ReasonTransfer) or, in a disaggregated fleet, the prefill worker whose
// leg costs least (ReasonDisagg; ReasonLocalPrefill where computing here
// prices less). Wait + Load|Leg + Prefill is the predicted time to first
// token (Needs.Calibrate); the engine times come from Rates' methods
// (timing.go). Above kvPruneAbove replicas, kvprune.go's lower bounds
// skip the candidates that cannot win, leaving the decision unchanged.
//
// Unhealthy replicas are never candidates; none healthy → Replica −1 with
// ReasonNoHealthy. Scraped metrics with !Scraped or LoadAge > kvStaleAfter
// are ignored: only the router's own counts are used. Ties go to the
// pinned replica, then to the lowest tieKey of Request.Hash.
type KVAware struct {
	// Precise asks the caller for a KV-event index; false means approximate.
	Precise bool
}

// Needs asks for a residency index, approximate unless Precise, and a
// Summary of the snapshots.
func (p KVAware) Needs() Needs {
	n := Needs{Index: Approximate, Calibrate: true, Summarize: true, StaleAfter: kvStaleAfter}
	if p.Precise {
		n.Index = Precise
	}
	return n
}

// kv-aware's settings, which configuration does not reach.
const (
	// kvStaleAfter is the age beyond which kv-aware ignores scraped
	// engine metrics: ten default scrape intervals.
	kvStaleAfter = time.Second
	// kvHighWater is the KV usage fraction above which the memory term
	// starts.
	kvHighWater = 0.9
	// kvMeanOutput is the expected output length, in tokens, of a request
	// that does not say it (Request.MaxTokens zero).
	kvMeanOutput = 256
)

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
	miss                         float64
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
		c.best, c.total, c.cached, c.imp, c.miss = i, total, k.Matched, k.Import, k.Miss
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
	return Decision{Replica: c.best, Reason: reason, Matched: c.cached, Costs: c.costs, Transfer: c.imp, Pruned: c.pruned, Miss: c.miss}
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

package fleet

import (
	"math"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
)

// Request is one request as the fleet routes it.
type Request struct {
	// ID identifies the request; Hash is a hash of it for tie-breaks.
	ID   string
	Hash uint64
	// Model is the requested model; only replicas serving it are
	// candidates. Empty means any.
	Model string
	// Session is the session id; empty means none.
	Session string
	// Tokens is the prompt length (an estimate in text mode); MaxTokens
	// the expected output, zero if unknown.
	Tokens, MaxTokens int
	// PrefixKey is route.Request.PrefixKey.
	PrefixKey uint64
	// Chains are the prompt's block hashes: one chain in text mode, one per
	// engine block size of the fleet in token mode (BlockSizes). The
	// ticket keeps the chosen replica's Hashes until Done (hold.go): do
	// not change them before.
	Chains []residency.Chain
	// SLO is the request's latency targets (route.Request.SLO).
	SLO route.SLO
	// Admitted says the request was admitted already (a retry or a
	// continuation after its replica failed): Decide routes it whatever
	// its SLO's predicted miss (Admission.SLO).
	Admitted bool
	// TTFT says the time to first token will be observed (a streamed
	// response), so that it can calibrate the chosen replica's rates, and
	// so will the inter-token latency (Claim.Streamed).
	TTFT bool
}

// Scratch holds a decision's buffers. Keep one per goroutine: Decide then
// allocates nothing but the ticket. After Decide it holds what the policy
// saw and said: Snapshot, Request (Match, Age, Pinned) and its Costs.
// Treat them as read-only (copy what you keep): the next Decide rewrites
// only the replicas of Snapshot that changed since.
type Scratch struct {
	Snapshot route.Snapshot
	Request  route.Request
	match    []int
	age      []time.Duration
	fresh    []int
	freshAge []time.Duration
	off      []int
	settled  []int
	costs    []route.Cost
	ms       residency.MatchScratch
	cache    snapCache
}

// Decide routes r at now: it takes a snapshot (replicas in exclude, and
// those known not to serve r's model, marked unhealthy), matches r's
// chains against the tracker, pins r's session, lets the policy pick, and
// commits the choice: the replica is charged (prefill = prompt − predicted
// cached tokens), the session bound to it and the blocks touched. The
// ticket is nil when the policy rejected the request (Decision.Replica
// −1), or admission control found the fleet saturated for it (Reason
// route.ReasonSaturated: the caller queues it or rejects it; see
// Admission), or the policy's choice is predicted to miss r's SLO and
// Admission.SLO says queue or reject (Reason route.ReasonUnattainable,
// Replica −1, the policy's Miss, Matched and Costs kept), before anything
// is committed.
func (f *Fleet) Decide(r *Request, exclude []int, now time.Time, sc *Scratch) (route.Decision, *Ticket) {
	unit := f.tr.Unit(r.Chains)
	snap := &sc.Snapshot
	f.refresh(snap, &sc.cache, now, unit)
	n := len(snap.Replicas)
	f.excludeModel(r.Model, snap, &sc.cache)
	for _, i := range exclude {
		if i >= 0 && i < n {
			sc.cache.force(snap, i)
		}
	}
	if f.cfg.Admission.saturated(snap, r.Tokens) {
		return route.Decision{Replica: -1, Reason: route.ReasonSaturated}, nil
	}
	sc.match, sc.age, sc.costs = fit(sc.match, n), fit(sc.age, n), fit(sc.costs, n)
	t := f.indexTime(now)
	blocks := 0
	if f.kind == route.NoIndex {
		clear(sc.match)
		clear(sc.age)
	} else {
		f.tr.Match(r.Chains, t, snap.BlockSize, sc.match, sc.age, &sc.ms)
		f.matchSlots(r.Chains, snap.BlockSize, sc.match)
	}
	fresh, freshAge := f.fresh(r, snap, t, sc)
	var off []int
	if f.kind == route.Precise {
		sc.off = fit(sc.off, n)
		if f.tr.MatchOffloaded(r.Chains, t, snap.BlockSize, sc.off, &sc.ms) {
			off = sc.off
		}
	}
	if len(r.Chains) > 0 && snap.BlockSize > 0 {
		blocks = len(r.Chains[0].Hashes) * r.Chains[0].Tokens / snap.BlockSize
	}
	pinned, turns, seen := f.pinPending(r.Session, firstChain(r.Chains), snap, now)
	snap.Seqs = f.averageSeqs(snap)
	sc.Request = route.Request{
		ID: r.ID, Hash: r.Hash, Seq: f.seq.Add(1) - 1,
		Tokens: r.Tokens, MaxTokens: r.MaxTokens, Blocks: blocks,
		Match: sc.match, Age: sc.age, Fresh: fresh, FreshAge: freshAge, Offloaded: off, Settled: f.settle(r, snap.BlockSize, sc), Pinned: pinned,
		FutureTurns: turns, Session: sessionHash(r.Session), PrefixKey: r.PrefixKey, SLO: r.SLO, Costs: sc.costs[:0],
	}
	d := f.policy.Pick(&sc.Request, snap)
	if d.Replica < 0 || d.Replica >= n {
		return d, nil
	}
	if f.cfg.Admission.refuses(r, &d) {
		d.Replica, d.Reason = -1, route.ReasonUnattainable
		return d, nil
	}
	f.countTurn(seen)
	return d, f.commit(r, d, now, sc)
}

// fresh fills sc's Fresh and FreshAge for the replicas whose approximate
// match is older than half their eviction horizon: how much of it other
// requests touched since (route.Request.Fresh). It returns nil slices when
// no replica has one.
func (f *Fleet) fresh(r *Request, snap *route.Snapshot, t time.Duration, sc *Scratch) ([]int, []time.Duration) {
	var fresh []int
	var ages []time.Duration
	for i, m := range sc.match {
		if m <= 0 {
			continue
		}
		h := snap.Replicas[i].Rates.Horizon
		if h <= 0 || sc.age[i] <= h/2 {
			continue
		}
		n, a := f.tr.Fresh(r.Chains, snap.BlockSize, i, m, h/2, t, &sc.ms)
		if n <= 0 {
			continue
		}
		if fresh == nil {
			sc.fresh, sc.freshAge = fit(sc.fresh, len(sc.match)), fit(sc.freshAge, len(sc.match))
			clear(sc.fresh)
			clear(sc.freshAge)
			fresh, ages = sc.fresh, sc.freshAge
		}
		fresh[i], ages[i] = n, a
	}
	return fresh, ages
}

// commit charges the decision's replica and binds the session to it.
func (f *Fleet) commit(r *Request, d route.Decision, now time.Time, sc *Scratch) *Ticket {
	f.mu.RLock()
	rep := f.reps[d.Replica]
	f.mu.RUnlock()
	c := Claim{
		PrefillTokens:   r.Tokens - d.Matched,
		Output:          max(r.MaxTokens, 0),
		Tokens:          r.Tokens + max(r.MaxTokens, 0),
		PredictedCached: d.Matched,
		PromptTokens:    r.Tokens,
	}
	if r.TTFT && f.needs.Calibrate {
		c.PredictedTTFT, c.PricedTTFT = predictedTTFT(d, &sc.Snapshot.Replicas[d.Replica])
	}
	c.Streamed = r.TTFT
	c.HitScale = sc.Snapshot.Replicas[d.Replica].Rates.HitScale
	c.Stale, c.StaleReplica = stale(&sc.Request, &sc.Snapshot)
	if sent, i := sc.ms.Evicted(sc.Request.Match); i >= 0 {
		// A replica the engine's events say lost some of what it was sent.
		if tokens := min(sent*sc.Snapshot.BlockSize, max(r.Tokens, 0)); tokens > c.Stale {
			c.Stale, c.StaleReplica = tokens, i
		}
	}
	if t := d.Transfer; t.Blocks > 0 {
		bs := sc.Snapshot.BlockSize
		own := 0
		if d.Replica < len(sc.Request.Match) {
			own = sc.Request.Match[d.Replica]
		}
		c.Imported = max(t.Blocks-own, 0) * bs
	}
	tk := f.acquire(rep, c, now, f.newTicket())
	if cl := f.takeSlot(rep, r.Chains, c.Output); cl != nil {
		if tk.ext == nil {
			tk.ext = new(ticketExt)
		}
		tk.ext.slot = cl
	}
	f.noteFeatures(tk, d, sc)
	if f.transfers() && len(r.Chains) > 0 && c.PrefillTokens > 0 && d.Replica < len(sc.Request.Match) {
		// It computes what the index does not match there (and what the
		// replica lost of that, which the match's price already expects).
		rep.prefills.add(tk, &r.Chains[0], sc.Request.Match[d.Replica]*sc.Snapshot.BlockSize)
	}
	f.bookLinks(d, now)
	if t := d.Transfer; t.Blocks > 0 && t.From >= 0 && t.From < len(sc.Snapshot.Replicas) && sc.Snapshot.Replicas[t.From].Role == route.RolePrefill {
		// A prefill leg: the worker computes what it does not cache, and
		// keeps it cached after (its index learns the prompt too); its
		// Share is of the legs. The leg's own load is charged by whoever
		// runs it (LegClaim).
		f.mu.RLock()
		leg := f.reps[t.From]
		f.mu.RUnlock()
		leg.arrived(sc.Request.Seq, len(sc.Snapshot.Replicas))
		f.tr.Touch(t.From, r.Chains, f.indexTime(now), &sc.ms)
	}
	if r.Session != "" {
		f.bind(r.Session, rep, now, firstChain(r.Chains))
	}
	rep.arrived(sc.Request.Seq, len(sc.Snapshot.Replicas))
	f.tr.Touch(d.Replica, r.Chains, f.indexTime(now), &sc.ms)
	tk.keepChain(r.Chains)
	f.peers.note(r, rep, now)
	return tk
}

// stale is the most prompt tokens request r matched on a replica whose
// match was last touched at least half its eviction horizon ago, and
// that replica (Claim.Stale); both 0 when there is none.
func stale(r *route.Request, s *route.Snapshot) (tokens, replica int) {
	if s.BlockSize <= 0 {
		return 0, 0
	}
	most := 0 // blocks
	for i, m := range r.Match[:min(len(r.Match), len(r.Age), len(s.Replicas))] {
		if m <= most { // most replicas: no deeper than the deepest so far
			continue
		}
		if h := s.Replicas[i].Rates.Horizon; h > 0 && r.Age[i] >= h/2 {
			most, replica = m, i
		}
	}
	return min(most*s.BlockSize, max(r.Tokens, 0)), replica
}

// predictedTTFT is the chosen candidate's time to first token at Scale 1:
// its Wait + Prefill, which the policy scaled by the replica's Scale,
// plus the KV import before them (on the links: no Scale); and the time
// to first token as the policy priced it (Wait + Prefill at the Scale,
// plus the import). Both are zero when the policy recorded no terms for
// it.
func predictedTTFT(d route.Decision, rp *route.Replica) (scale1, priced time.Duration) {
	for _, k := range d.Costs {
		if k.Replica != d.Replica {
			continue
		}
		scale := rp.Rates.Scale
		if scale <= 0 {
			scale = 1
		}
		links := k.Import.Time + k.Load
		return time.Duration(float64(k.Wait+k.Prefill)/scale) + links, k.Wait + k.Prefill + links
	}
	return 0, 0
}

// IndexMode names the residency feed replica i is matched against now,
// or for i −1 the one the policy reads: "precise" (its KV events; for
// the fleet, some replicas may be falling back), "approximate" or
// "none".
func (f *Fleet) IndexMode(i int) string {
	switch {
	case f.kind == route.NoIndex:
		return "none"
	case i < 0 && f.kind == route.Precise, f.tr.Live(i):
		return "precise"
	}
	return "approximate"
}

// fit returns s with length n, reusing its array when it is large enough.
func fit[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// firstChain is the block hashes of a request's first chain, or nil.
func firstChain(chains []residency.Chain) []prefix.Hash {
	if len(chains) == 0 {
		return nil
	}
	return chains[0].Hashes
}

// averageSeqs folds the running sequences of snap's candidates into the
// fleet's average over its latest decisions (route.Snapshot.Seqs) and
// returns it; zero when snap has no Summary to count them.
func (f *Fleet) averageSeqs(snap *route.Snapshot) float64 {
	if snap.Summary == nil {
		return 0
	}
	x, n := float64(snap.Summary.Seqs()), len(snap.Replicas)
	for {
		old := f.seqs.Load()
		mean := route.Averaged(math.Float64frombits(old), x, n)
		if f.seqs.CompareAndSwap(old, math.Float64bits(mean)) {
			return mean
		}
	}
}

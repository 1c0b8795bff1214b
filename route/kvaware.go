package route

import "time"

// KVAware is kvrouter's default policy: the cost model of design.md §3.
// Every candidate is priced in one unit, time, and the cheapest wins:
//
//	Total = (Wait + Prefill + Decode + Memory) × Rates.Scale
//
// from the replica's Rates (zero fields: the llama3-8b-h100 defaults of this
// package) and the snapshot:
//
//   - Matched: expected cached tokens = p × Match×BlockSize (at most the
//     prompt), p = exp(−Age/Rates.Horizon) the probability the prefix is
//     still resident (Horizon 0: p = 1). Old entries decay smoothly instead
//     of expiring at a fixed TTL.
//   - Wait: time until the replica can start this prefill: the router's own
//     queued uncached prefill tokens (Replica.PrefillTokens) × prefill time
//     per token; when fresh engine metrics show more waiting requests than
//     our own undecided ones (InFlight − Decoding), the others are assumed
//     to be the size of our queued ones (or of this request) and added. When
//     the batch is full (occupancy ≥ MaxSeqs, occupancy = InFlight or the
//     engine's Running+Waiting), each request beyond the batch waits one slot:
//     MeanOutput × step(MaxSeqs) / MaxSeqs, the mean time for a slot to
//     free.
//   - Prefill: prefill time of the uncached tokens after the cached ones,
//     with the attention term (Rates.prefillTime).
//   - Decode: the interference between this request and the running decodes
//     (B = the engine's Running when fresh, else our own Decoding): the
//     iteration that carries its prefill also steps B decodes, step(B) =
//     DecodeStep + B × DecodePerSeq (the slowdown it suffers), and its
//     prefill stalls those B decodes, counted as Prefill × B / MaxSeqs (the
//     delay it imposes, one batch slot's share each). Monotone in B and in
//     Prefill.
//   - Memory: with u the KV usage after admitting this request's uncached
//     and output blocks (the engine's KVUsage when fresh, else our own
//     DecodeBlocks / CacheBlocks), above HighWater the request evicts cached
//     prefixes others would reuse: (u − HighWater)/(1 − HighWater) × the
//     prefill time of the blocks it allocates; above 1 a running sequence is
//     preempted and recomputed: + the prefill time of an average in-flight
//     context.
//
// The behaviours of design.md §3 fall out of these terms, each covered by a
// test in kvaware_test.go: a short or small match saves little prefill time,
// so load decides; a session's replica holds its blocks, so Match keeps it
// there (Pinned only breaks exact ties, or earns PinBonus if set); a deep
// queue on the holder costs more Wait than the Prefill it saves, so
// stickiness breaks and a hot prefix spreads to a second replica (which
// then holds it); an old entry's p decays; a nearly full replica pays Memory.
//
// Unhealthy replicas are never candidates; none healthy → Replica −1 with
// ReasonNoHealthy. Scraped metrics with !Scraped or LoadAge > StaleAfter are
// ignored: only the router's own counts are used. Ties go to the pinned
// replica, then to the lowest tieKey of Request.Hash.
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
	// PinBonus is subtracted from the session's pinned replica's Total
	// (floored at 0); zero means none, and pinning only breaks exact ties.
	PinBonus time.Duration
	// Precise asks the caller for a KV-event index; false means approximate.
	Precise bool
}

// Needs asks for a residency index, approximate unless Precise.
func (p KVAware) Needs() Needs {
	if p.Precise {
		return Needs{Index: Precise}
	}
	return Needs{Index: Approximate}
}

// Pick chooses the replica with the least expected cost. It allocates
// nothing: the terms are computed in float64 nanoseconds and converted to
// Durations only for the recorded costs.
func (p KVAware) Pick(r *Request, s *Snapshot) Decision {
	sc := kvScan{p: p.withDefaults(), r: r, bs: blockSize(s), out: r.MaxTokens, prefill0: -1}
	if sc.out <= 0 {
		sc.out = sc.p.MeanOutput
	}
	sc.invBS = 1 / float64(sc.bs)
	sc.tm.set(&sc.prev)
	costs := costsFor(r, len(s.Replicas))
	best, bestCached, maxCached := -1, 0, 0
	bestTotal := 0.0
	var t kvTerms
	for i := range s.Replicas {
		rp := &s.Replicas[i]
		if !rp.Healthy {
			continue
		}
		sc.terms(&t, rp, i)
		if costs != nil {
			costs = costs[:len(costs)+1]
			t.fill(&costs[len(costs)-1], i)
		}
		maxCached = max(maxCached, t.cached)
		if best < 0 || t.total < bestTotal || t.total == bestTotal && p.tieBefore(r, i, best) {
			best, bestTotal, bestCached = i, t.total, t.cached
		}
	}
	if best < 0 {
		return Decision{Replica: -1, Reason: ReasonNoHealthy, Costs: costs}
	}
	return Decision{Replica: best, Reason: kvReason(r, best, bestCached, maxCached, sc.bs), Matched: bestCached, Costs: costs}
}

// kvScan is one Pick's state: the request, and the timing of the last
// replica's Rates, reused while consecutive replicas share them (the usual
// case: one preset), with the prefill time of an uncached prompt.
type kvScan struct {
	p        KVAware
	r        *Request
	bs, out  int
	invBS    float64
	prev     Rates
	tm       timing
	prefill0 float64 // prefill of the whole prompt with tm; < 0: not computed
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

// tieBefore reports whether i wins an exact tie against j.
func (KVAware) tieBefore(r *Request, i, j int) bool {
	if i == r.Pinned || j == r.Pinned {
		return i == r.Pinned
	}
	return tieKey(r.Hash, i) < tieKey(r.Hash, j)
}

// kvReason names why best won: its session, its prefix, passing over a
// deeper holder (spread), or plain least cost.
func kvReason(r *Request, best, cached, maxCached, bs int) string {
	switch {
	case best == r.Pinned && matchOf(r, best) > 0:
		return ReasonSession
	case cached >= bs && cached >= maxCached:
		return ReasonPrefix
	case maxCached >= bs && maxCached > cached:
		return ReasonSpread
	}
	return ReasonLeastCost
}

// kvTerms is one candidate's cost terms in nanoseconds, already scaled.
type kvTerms struct {
	cached                               int
	wait, prefill, decode, memory, total float64
}

// fill writes t into c as the Cost of replica i, field by field (building a
// Cost and copying it stalls on store forwarding).
func (t *kvTerms) fill(c *Cost, i int) {
	c.Replica, c.Matched = i, t.cached
	c.Wait, c.Prefill, c.Decode = time.Duration(t.wait), time.Duration(t.prefill), time.Duration(t.decode)
	c.Memory, c.Total = time.Duration(t.memory), time.Duration(t.total)
}

// timing is a replica's Rates as float64 nanoseconds with defaults filled.
type timing struct {
	perTok, attn, step, perSeq, maxSeqs, invSeqs, scale float64
}

// set fills t from rt with defaults, as Rates.withDefaults does, in
// float64 (in place: building and copying a struct here costs more than all
// the arithmetic of a Pick).
func (t *timing) set(rt *Rates) {
	t.perTok, t.attn, t.step, t.perSeq, t.maxSeqs, t.invSeqs, t.scale = float64(DefaultPrefillPerToken),
		float64(DefaultAttnPerToken2)*1e-6, float64(DefaultDecodeStep), float64(DefaultDecodePerSeq),
		DefaultMaxSeqs, 1.0/DefaultMaxSeqs, 1
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
	if rt.Scale > 0 {
		t.scale = rt.Scale
	}
}

// prefill is the prefill time of n new tokens after c cached, in ns.
func (t *timing) prefill(n, c float64) float64 {
	return n*t.perTok + n*(c+n/2)*t.attn
}

// terms prices replica rp (index i) into t.
func (sc *kvScan) terms(t *kvTerms, rp *Replica, i int) {
	if !sameRates(&rp.Rates, &sc.prev) {
		sc.prev = rp.Rates
		sc.tm.set(&rp.Rates)
		sc.prefill0 = -1
	}
	p, r, tm := &sc.p, sc.r, &sc.tm
	fresh := rp.Scraped && rp.LoadAge <= p.StaleAfter
	t.cached = 0
	if m := min(matchOf(r, i)*sc.bs, r.Tokens); m > 0 {
		t.cached = int(residency(ageOf(r, i), rp.Rates.Horizon) * float64(m))
	}
	uncached := float64(r.Tokens - t.cached)
	switch {
	case t.cached > 0:
		t.prefill = tm.prefill(uncached, float64(t.cached))
	case sc.prefill0 >= 0:
		t.prefill = sc.prefill0
	default:
		t.prefill = tm.prefill(uncached, 0)
		sc.prefill0 = t.prefill
	}
	t.wait = sc.wait(rp, fresh)
	batch := float64(rp.Decoding)
	if fresh {
		batch = float64(rp.Running)
	}
	t.decode = tm.step + batch*tm.perSeq + t.prefill*batch*tm.invSeqs
	t.memory = 0
	if need := (uncached + float64(sc.out)) * sc.invBS; nearFull(rp, fresh, need, p.HighWater) {
		t.memory = p.memory(rp, tm, fresh, need, sc.bs)
	}
	if tm.scale != 1 {
		t.wait, t.prefill, t.decode, t.memory = t.wait*tm.scale, t.prefill*tm.scale, t.decode*tm.scale, t.memory*tm.scale
	}
	t.total = t.wait + t.prefill + t.decode + t.memory
	if i == r.Pinned && p.PinBonus > 0 {
		t.total = max(t.total-float64(p.PinBonus), 0)
	}
}

// sameRates is a == b, field by field (the compiler's == on Rates calls a
// memory-compare function, slower than the rest of a candidate's pricing).
func sameRates(a, b *Rates) bool {
	return a.PrefillPerToken == b.PrefillPerToken && a.AttnPerToken2 == b.AttnPerToken2 &&
		a.DecodeStep == b.DecodeStep && a.DecodePerSeq == b.DecodePerSeq && a.MaxSeqs == b.MaxSeqs &&
		a.Horizon == b.Horizon && a.Scale == b.Scale
}

// wait is the time until rp can start a prefill of the request, in ns:
// queued prefill work (ours, plus others' seen in fresh metrics) and a
// full-batch penalty.
func (sc *kvScan) wait(rp *Replica, fresh bool) float64 {
	tm := &sc.tm
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
	w := float64(queued) * tm.perTok
	if over := float64(occupancy) - tm.maxSeqs + 1; over > 0 {
		// One slot frees every out × step(MaxSeqs) / MaxSeqs on average.
		w += over * float64(sc.out) * (tm.step + tm.maxSeqs*tm.perSeq) * tm.invSeqs
	}
	return w
}

// nearFull reports whether admitting need more blocks may push rp's KV
// usage above highWater (a cheap test before memory).
func nearFull(rp *Replica, fresh bool, need, highWater float64) bool {
	c := float64(rp.CacheBlocks)
	if c <= 0 {
		return fresh && rp.KVUsage > highWater
	}
	used := float64(rp.DecodeBlocks)
	if fresh {
		used = max(used, rp.KVUsage*c)
	}
	return used+need > highWater*c
}

// memory is the expected cost, in ns, of evictions and preemption when
// admitting need more blocks pushes rp's KV usage above HighWater.
func (p *KVAware) memory(rp *Replica, tm *timing, fresh bool, need float64, bs int) float64 {
	capacity := float64(rp.CacheBlocks)
	used := float64(rp.DecodeBlocks) // in blocks, or a fraction when capacity is unknown
	if fresh && rp.KVUsage*capacity > used {
		used = rp.KVUsage * capacity
	}
	after := used + need
	if capacity <= 0 {
		if !fresh {
			return 0
		}
		capacity, after = 1, rp.KVUsage // fraction only: this request's share is unknown
	}
	if after <= p.HighWater*capacity {
		return 0
	}
	frac := (after/capacity - p.HighWater) / (1 - p.HighWater)
	m := frac * tm.prefill(need*float64(bs), 0)
	if after > capacity {
		ctx := need * float64(bs)
		if rp.InFlight > 0 && rp.DecodeBlocks > 0 {
			ctx = float64(rp.DecodeBlocks*bs) / float64(rp.InFlight)
		}
		m += tm.prefill(ctx, 0)
	}
	return m
}

var (
	_ Policy = KVAware{}
	_ Needer = KVAware{}
)

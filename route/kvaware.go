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

// Pick chooses the replica with the least expected cost.
func (p KVAware) Pick(r *Request, s *Snapshot) Decision {
	p = p.withDefaults()
	bs := blockSize(s)
	costs := costsFor(r, len(s.Replicas))
	best, maxCached := -1, 0
	var bc Cost
	for i := range s.Replicas {
		rp := &s.Replicas[i]
		if !rp.Healthy {
			continue
		}
		c := p.cost(r, rp, i, bs)
		if costs != nil {
			costs = append(costs, c)
		}
		maxCached = max(maxCached, c.Matched)
		if best < 0 || c.Total < bc.Total || c.Total == bc.Total && p.tieBefore(r, i, best) {
			best, bc = i, c
		}
	}
	if best < 0 {
		return Decision{Replica: -1, Reason: ReasonNoHealthy, Costs: costs}
	}
	return Decision{Replica: best, Reason: kvReason(r, best, bc.Matched, maxCached, bs), Matched: bc.Matched, Costs: costs}
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

// cost prices replica rp (index i) for request r.
func (p KVAware) cost(r *Request, rp *Replica, i, bs int) Cost {
	rt := rp.Rates.withDefaults()
	fresh := rp.Scraped && rp.LoadAge <= p.StaleAfter
	cached := 0
	if m := min(matchOf(r, i)*bs, r.Tokens); m > 0 {
		cached = int(residency(ageOf(r, i), rt.Horizon) * float64(m))
	}
	uncached := r.Tokens - cached
	out := r.MaxTokens
	if out <= 0 {
		out = p.MeanOutput
	}
	c := Cost{Replica: i, Matched: cached}
	c.Wait = p.wait(rp, &rt, fresh, r.Tokens, out)
	c.Prefill = rt.prefillTime(uncached, cached)
	batch := rp.Decoding
	if fresh {
		batch = rp.Running
	}
	c.Decode = rt.stepTime(batch) + c.Prefill*time.Duration(batch)/time.Duration(rt.MaxSeqs)
	c.Memory = p.memory(rp, &rt, fresh, (uncached+out+bs-1)/bs, bs)
	if rt.Scale != 1 {
		c.Wait, c.Prefill = scaled(c.Wait, rt.Scale), scaled(c.Prefill, rt.Scale)
		c.Decode, c.Memory = scaled(c.Decode, rt.Scale), scaled(c.Memory, rt.Scale)
	}
	c.Total = c.Wait + c.Prefill + c.Decode + c.Memory
	if i == r.Pinned && p.PinBonus > 0 {
		c.Total = max(c.Total-p.PinBonus, 0)
	}
	return c
}

// wait is the time until rp can start a prefill of tokens: queued prefill
// work (ours, plus others' seen in fresh metrics) and a full-batch penalty.
func (p KVAware) wait(rp *Replica, rt *Rates, fresh bool, tokens, out int) time.Duration {
	queued := rp.PrefillTokens
	own := max(rp.InFlight-rp.Decoding, 0)
	occupancy := rp.InFlight
	if fresh {
		if extra := rp.Waiting - own; extra > 0 {
			per := tokens
			if own > 0 {
				per = rp.PrefillTokens / own
			}
			queued += extra * per
		}
		occupancy = max(occupancy, rp.Running+rp.Waiting)
	}
	w := time.Duration(queued) * rt.PrefillPerToken
	if over := occupancy - rt.MaxSeqs + 1; over > 0 {
		slot := time.Duration(out) * rt.stepTime(rt.MaxSeqs) / time.Duration(rt.MaxSeqs)
		w += time.Duration(over) * slot
	}
	return w
}

// memory is the expected cost of evictions and preemption when admitting
// need more blocks pushes rp's KV usage above HighWater.
func (p KVAware) memory(rp *Replica, rt *Rates, fresh bool, need, bs int) time.Duration {
	used := 0.0
	if rp.CacheBlocks > 0 {
		used = float64(rp.DecodeBlocks) / float64(rp.CacheBlocks)
	}
	if fresh {
		used = max(used, rp.KVUsage)
	}
	after := used
	if rp.CacheBlocks > 0 {
		after += float64(need) / float64(rp.CacheBlocks)
	}
	if after <= p.HighWater {
		return 0
	}
	frac := (after - p.HighWater) / (1 - p.HighWater)
	m := time.Duration(frac * float64(rt.prefillTime(need*bs, 0)))
	if after > 1 {
		ctx := need * bs
		if rp.InFlight > 0 && rp.DecodeBlocks > 0 {
			ctx = rp.DecodeBlocks * bs / rp.InFlight
		}
		m += rt.prefillTime(ctx, 0)
	}
	return m
}

var (
	_ Policy = KVAware{}
	_ Needer = KVAware{}
)

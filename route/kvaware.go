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
		return Needs{Index: Precise, Calibrate: true}
	}
	return Needs{Index: Approximate, Calibrate: true}
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

var (
	_ Policy = KVAware{}
	_ Needer = KVAware{}
)

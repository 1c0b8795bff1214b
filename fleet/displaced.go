package fleet

// displacedTally learns a replica's Rates.Displaced: of the tokens the
// replica stores (the prompt tokens it computed and those it generated,
// each of which evicts one once its cache is full), the share that later
// requests asked it for again after they were evicted. Both are summed
// over the router's completed requests with exponentially decaying
// weights (about the last displacedMemory). A request's evicted tokens
// are those of its deepest match on a replica that the engine serving it
// did not have cached, wherever it was sent, charged to the replica that
// held the match, and counted only for a match last touched at least half
// that replica's eviction horizon ago (Claim.Stale): LRU evicts what is
// oldest, and a younger shortfall is a prefix still being computed, or a
// placement elsewhere while the holder still had it, not an eviction. In
// precise mode a match has no age, but the engine's events say what it
// evicted: what the router sent a replica (its approximate match) beyond
// what the replica holds (residency.MatchScratch.Evicted).
//
// Before the cache has filled nothing is evicted: the tokens that fill
// it are not counted as stored, so that the share does not stay diluted
// by them for the tally's memory.
type displacedTally struct {
	r      decayingRatio // evicted over stored
	filled float64       // tokens stored so far, up to the capacity
}

// displacedMemory is the requests the tally remembers, about: evictions
// are rarer than hits, so it remembers longer than hitTally.
const displacedMemory = 256

// observe adds evicted tokens a request asked the replica for again and
// stored tokens a request made it store, past the first capacity tokens
// (zero: unknown, all count).
func (d *displacedTally) observe(evicted, stored, capacity float64) {
	if fill := min(stored, capacity-d.filled); fill > 0 {
		d.filled += fill
		stored -= fill
	}
	d.r.add(evicted, stored, displacedMemory)
}

// share is the learned Displaced, 0..1: 0 until the replica stored a
// token.
func (d *displacedTally) share() float64 {
	v, ok := d.r.ratio()
	if !ok {
		return 0
	}
	return min(v, 1)
}

// stored is the tokens a completed request made its replica store: the
// prompt tokens it computed or imported (imported of the cached ones)
// and those it generated.
func stored(u Usage, imported int) float64 {
	return float64(max(u.PromptTokens-u.CachedTokens+imported, 0) + max(u.CompletionTokens, 0))
}

// observeEvicted adds to the tally of the claim's stale replica the
// tokens of its stale match the engine that served the request did not
// have cached of its own (in the engine's tokens; imported ones were
// another's): what that replica evicted and was asked for again,
// wherever the request went.
func (f *Fleet) observeEvicted(c *Claim, u Usage) {
	if c.Stale <= 0 || c.PromptTokens <= 0 || u.CachedTokens < 0 || u.PromptTokens <= 0 {
		return
	}
	stale := int(int64(min(c.Stale, c.PromptTokens)) * int64(u.PromptTokens) / int64(c.PromptTokens))
	evicted := stale - max(u.CachedTokens-c.importedOf(u.PromptTokens), 0)
	if evicted <= 0 {
		return
	}
	f.mu.RLock()
	var r *replica
	if c.StaleReplica >= 0 && c.StaleReplica < len(f.reps) {
		r = f.reps[c.StaleReplica]
	}
	f.mu.RUnlock()
	if r == nil {
		return
	}
	r.mu.Lock()
	r.displaced.observe(float64(evicted), 0, 0)
	f.updateLocked(r)
	r.mu.Unlock()
}

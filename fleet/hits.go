package fleet

// hitTally learns a replica's Rates.HitScale: the engine's cached tokens
// over the ones the policy expected, both summed with exponentially
// decaying weights (about the last hitMemory requests). The expected
// ones are taken at HitScale 1 (the prediction over the scale it was made
// with), so that the tally learns the whole correction, not a correction
// of itself. It is a ratio of sums, not a mean of ratios: a request
// expected to hit 6,000 tokens that found none weighs as much as it
// missed, and one expected to hit nothing says nothing.
type hitTally struct {
	r decayingRatio // actual over expected
}

// hitMemory is the requests the tally remembers, about.
const hitMemory = 32

// Bounds of HitScale: never more than double what the model expects, and
// at least a twentieth (a replica is never believed to cache nothing).
const (
	minHitScale = 0.05
	maxHitScale = 2
)

// observe adds one request that expected expected cached tokens at
// HitScale 1 and found actual.
func (h *hitTally) observe(expected, actual float64) {
	h.r.add(actual, expected, hitMemory)
}

// scale is the learned HitScale: 1 until a request expected a hit.
func (h *hitTally) scale() float64 {
	v, ok := h.r.ratio()
	if !ok {
		return 1
	}
	return min(max(v, minHitScale), maxHitScale)
}

// observeHitsLocked corrects the replica's HitScale from one completed
// request: predicted cached tokens (in the engine's tokens) against the
// engine's; r.mu is held.
func (t *Ticket) observeHitsLocked(predicted, actual int) {
	scale := t.claim.HitScale
	if scale <= 0 {
		scale = 1
	}
	t.r.hits.observe(float64(predicted)/scale, float64(actual))
}

package fleet

// decayingRatio is the ratio of two sums, each with exponentially
// decaying weights: every add keeps 1 − 1/memory of what was there. A
// replica's HitScale and Displaced are learned so: a ratio of sums, not a
// mean of ratios, so that each request weighs as much as its tokens.
type decayingRatio struct{ num, den float64 }

// add adds num and den, after decaying both by 1/memory.
func (r *decayingRatio) add(num, den, memory float64) {
	keep := 1 - 1/memory
	r.num = r.num*keep + num
	r.den = r.den*keep + den
}

// ratio is num/den, and false while den is not positive.
func (r *decayingRatio) ratio() (float64, bool) {
	if r.den <= 0 {
		return 0, false
	}
	return r.num / r.den, true
}

// Package window sums values over a sliding span of time: the router's
// recent prefill per replica (fleet, for Preble's load window) and a
// replica's recent request outcomes (health's passive checks).
package window

import "time"

// Buckets is the number of time buckets a window is kept in: a sum is
// exact to one bucket, span/Buckets.
const Buckets = 10

// Sums is a pair of sums over a sliding span of time, kept in a ring of
// Buckets buckets, each covering span/Buckets: A and B may count two
// things at once (failures and outcomes, say), or A alone. The span is
// given to each call and must stay the same. The zero value is an empty
// window; it is not safe for concurrent use and allocates nothing.
type Sums struct {
	b [Buckets]bucket
}

type bucket struct {
	epoch int64 // time slice index, now / width
	a, b  int64
}

// width is the span of one bucket (at least 1 ns).
func width(span time.Duration) int64 { return max(int64(span)/Buckets, 1) }

// Add adds a and b at now.
func (w *Sums) Add(now time.Time, span time.Duration, a, b int64) {
	epoch := now.UnixNano() / width(span)
	k := &w.b[epoch%Buckets]
	if k.epoch != epoch {
		*k = bucket{epoch: epoch}
	}
	k.a += a
	k.b += b
}

// Sum returns what was added in the span ending at now.
func (w *Sums) Sum(now time.Time, span time.Duration) (a, b int64) {
	epoch := now.UnixNano() / width(span)
	for _, k := range w.b {
		if k.epoch > epoch-Buckets && k.epoch <= epoch {
			a += k.a
			b += k.b
		}
	}
	return a, b
}

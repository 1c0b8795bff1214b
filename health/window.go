package health

import "time"

// buckets is the number of time buckets a window is kept in.
const buckets = 10

// window counts outcomes over a sliding span of time in a ring of buckets,
// each covering span/buckets. Its zero value is an empty window. It is not
// safe for concurrent use.
type window struct {
	b [buckets]bucket
}

// bucket holds the outcomes of one slice of time.
type bucket struct {
	epoch           int64 // index of the time slice, now / width
	fails, outcomes int
}

// width is the span of one bucket (at least 1 ns).
func width(span time.Duration) int64 {
	return max(int64(span)/buckets, 1)
}

// add records one outcome at now.
func (w *window) add(now time.Time, span time.Duration, failed bool) {
	epoch := now.UnixNano() / width(span)
	b := &w.b[epoch%buckets]
	if b.epoch != epoch {
		*b = bucket{epoch: epoch}
	}
	b.outcomes++
	if failed {
		b.fails++
	}
}

// sum returns the failures and all outcomes recorded in the span ending at
// now.
func (w *window) sum(now time.Time, span time.Duration) (fails, outcomes int) {
	epoch := now.UnixNano() / width(span)
	for _, b := range w.b {
		if b.epoch > epoch-buckets && b.epoch <= epoch {
			fails += b.fails
			outcomes += b.outcomes
		}
	}
	return fails, outcomes
}

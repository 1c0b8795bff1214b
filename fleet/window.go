package fleet

import "time"

// windowBuckets is the number of time buckets a recent-prefill window is
// kept in: the sum is exact to one bucket (Window/10).
const windowBuckets = 10

// recent sums amounts (prefill tokens) over a sliding span of time in a ring
// of buckets. The zero value is empty. It is not safe for concurrent use.
type recent struct {
	b [windowBuckets]struct {
		epoch int64 // time slice index, now / width
		sum   int64
	}
}

// recentWidth is the span of one bucket (at least 1 ns).
func recentWidth(span time.Duration) int64 {
	return max(int64(span)/windowBuckets, 1)
}

// add records n at now.
func (w *recent) add(now time.Time, span time.Duration, n int64) {
	epoch := now.UnixNano() / recentWidth(span)
	b := &w.b[epoch%windowBuckets]
	if b.epoch != epoch {
		b.epoch, b.sum = epoch, 0
	}
	b.sum += n
}

// total returns the amounts recorded in the span ending at now.
func (w *recent) total(now time.Time, span time.Duration) int64 {
	epoch := now.UnixNano() / recentWidth(span)
	var t int64
	for _, b := range w.b {
		if b.epoch > epoch-windowBuckets && b.epoch <= epoch {
			t += b.sum
		}
	}
	return t
}

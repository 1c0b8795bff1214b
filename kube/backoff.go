package kube

import (
	"context"
	"time"
)

// Follow's backoff. Every attempt that fails, every watch that ends
// before stableWatch (with or without events) and every 410 Gone waits
// before the next request: minBackoff, doubling to maxBackoff, each wait
// drawn from [d, 2d) so that routers that lost their watches together do
// not come back together. Only a watch that lived stableWatch resets it,
// so a server that ends every watch at once, or answers every watch 410,
// is asked at most once per wait however it answers; past the first few
// waits that is less than once a second. A Retry-After (header, or a
// Status's retryAfterSeconds) is waited instead, from 1 s to
// maxRetryAfter, plus up to a tenth more.
const (
	minBackoff    = 500 * time.Millisecond
	maxBackoff    = 16 * time.Second
	stableWatch   = 30 * time.Second
	maxRetryAfter = 5 * time.Minute
)

// backoff is the next wait of one Follow.
type backoff struct{ next time.Duration }

// wait returns how long to wait now and doubles the next; jitter is in
// [0, 1), retryAfter the server's own ask (zero: none).
func (b *backoff) wait(retryAfter time.Duration, jitter float64) time.Duration {
	d := max(b.next, minBackoff)
	b.next = min(2*d, maxBackoff)
	if retryAfter > 0 {
		d := min(max(retryAfter, time.Second), maxRetryAfter)
		return d + time.Duration(jitter*float64(d)/10)
	}
	return d + time.Duration(jitter*float64(d))
}

func (b *backoff) reset() { b.next = minBackoff }

// sleep waits d or until ctx is done; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

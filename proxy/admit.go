package proxy

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/fleet"
)

// HeaderPriority is the request header that sets a request's priority in
// the admission queue: an integer, higher first, zero by default. A
// negative priority is sheddable: when the fleet is saturated it is
// rejected at once rather than queued (as the Gateway API Inference
// Extension's Sheddable criticality).
const HeaderPriority = "X-Priority"

// errRateLimit is the OpenAI error type of a 429.
const errRateLimit = "rate_limit_error"

// maxPriority bounds HeaderPriority's magnitude.
const maxPriority = 1000

// admissionTick is how often the head of a non-empty queue tries again
// without a release (the engines' own queues, which scrapes show, may
// have shrunk).
const admissionTick = 50 * time.Millisecond

// admission is the live router's queue of requests that no replica could
// take in time (fleet.Admission): each waits in its own handler until the
// fleet's OnRelease (a replica freed load) or the tick wakes it at the
// head of the queue, then is decided again.
type admission struct {
	cfg   fleet.Admission
	q     *fleet.Queue[*waiter]
	armed atomic.Bool // a tick is pending
	wait  prometheus.Histogram
}

// waiter is one queued request's wake-up: a signal, and whether it was
// left out of a full queue by a higher priority.
type waiter struct {
	ch      chan struct{}
	evicted atomic.Bool
}

func (w *waiter) signal() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// newAdmission returns the queue for cfg with its metrics registered on
// reg, or nil when admission control is off.
func newAdmission(cfg fleet.Admission, reg prometheus.Registerer) (*admission, error) {
	if cfg.MaxWait <= 0 {
		return nil, nil
	}
	a := &admission{cfg: cfg, q: fleet.NewQueue[*waiter](cfg.Capacity()),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvrouter_queue_wait_seconds",
			Help:    "Time requests waited in the router's admission queue before a replica took them, seconds.",
			Buckets: latencyBuckets,
		})}
	depth := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvrouter_queue_requests",
		Help: "Requests waiting in the router's admission queue (every replica saturated).",
	}, func() float64 { return float64(a.q.Len()) })
	for _, c := range []prometheus.Collector{a.wait, depth} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// wake lets the request at the head of the queue try again. It is the
// fleet's OnRelease: it never blocks.
func (a *admission) wake() {
	if e := a.q.Pop(); e != nil {
		e.Value.signal()
	}
}

// arm schedules a tick, unless one is pending.
func (a *admission) arm() {
	if a.armed.CompareAndSwap(false, true) {
		time.AfterFunc(admissionTick, func() {
			a.armed.Store(false)
			if a.q.Len() > 0 {
				a.wake()
				a.arm()
			}
		})
	}
}

// push queues e, evicting the entry a full queue leaves out; it reports
// whether e itself is in the queue.
func (a *admission) push(e *fleet.Entry[*waiter]) bool {
	out := a.q.Push(e)
	if out == e {
		return false
	}
	if out != nil {
		out.Value.evicted.Store(true)
		out.Value.signal()
	}
	a.arm()
	return true
}

// queue holds the call, which found the fleet saturated, until a replica
// takes it: it waits at its place in the queue, is decided again each time
// it is woken, and answers 429 when it is sheddable, left out of a full
// queue, or still waiting after the timeout, or ends when the client goes
// away. It returns the time of the decision that took it, and false when
// it answered the client (or the client left).
func (c *call) queue(ctx context.Context, w http.ResponseWriter, priority int) (time.Time, bool) {
	rt, a := c.rt, c.rt.adm
	if a == nil || priority < 0 {
		return time.Time{}, c.saturated(w, "queue_sheddable", "every replica is saturated and the request's priority is sheddable")
	}
	since := rt.now()
	e := &fleet.Entry[*waiter]{Value: &waiter{ch: make(chan struct{}, 1)}, Priority: priority, Since: since}
	timer := time.NewTimer(c.queueTimeout(a))
	defer timer.Stop()
	for {
		if !a.push(e) || e.Value.evicted.Load() {
			return time.Time{}, c.saturated(w, "queue_full", "every replica is saturated and the router's queue is full")
		}
		select {
		case <-e.Value.ch:
		case <-timer.C:
			c.leave(e)
			return time.Time{}, c.queueExpired(w, a)
		case <-ctx.Done():
			c.leave(e)
			return time.Time{}, false
		}
		if e.Value.evicted.Load() {
			continue
		}
		c.redecideSLO()
		t0 := c.decideNow()
		if c.admitted() {
			a.wait.Observe(rt.now().Sub(since).Seconds())
			a.wake() // the next one may fit too
			return t0, true
		}
	}
}

// leave takes e out of the queue; one already popped (woken) passes its
// wake-up on.
func (c *call) leave(e *fleet.Entry[*waiter]) {
	if !c.rt.adm.q.Remove(e) {
		c.rt.adm.wake()
	}
}

// saturated answers 429 with Retry-After: the time until the least
// backlogged replica of the last snapshot is back within the limit.
func (c *call) saturated(w http.ResponseWriter, code, msg string) bool {
	after := time.Second
	if a := c.rt.adm; a != nil {
		after = c.retryAfter(a.cfg.MaxWait)
	}
	return c.tooMany(w, code, msg, after)
}

// retryAfter is the time until the least backlogged healthy replica of
// the last snapshot has at most bound of predicted wait (fleet.Admission
// Backlog), within 1 s..1 min.
func (c *call) retryAfter(bound time.Duration) time.Duration {
	best := time.Duration(-1)
	for i := range c.seen().Snapshot.Replicas {
		rp := &c.seen().Snapshot.Replicas[i]
		if b := c.rt.cfg.Admission.Backlog(rp, c.freq.Tokens); rp.Healthy && (best < 0 || b < best) {
			best = b
		}
	}
	return min(max(best-bound, time.Second), time.Minute)
}

// tooMany answers 429 with Retry-After (after, rounded up to seconds)
// and records the call.
func (c *call) tooMany(w http.ResponseWriter, code, msg string, after time.Duration) bool {
	w.Header().Set("Retry-After", strconv.Itoa(int((after+time.Second-1)/time.Second)))
	c.fail(w, http.StatusTooManyRequests, errRateLimit, code, msg)
	c.record()
	return false
}

// priorityOf parses the request's HeaderPriority: when absent, its API
// key's default (ReadKeys), else zero. With API keys, the key's priority
// is also the highest the request may claim: a header above it counts as
// the key's (a batch key cannot claim a place ahead of interactive ones).
func priorityOf(r *http.Request) (int, bool) {
	v := r.Header.Get(HeaderPriority)
	key, keyed := keyOf(r.Context())
	if v == "" {
		return key.priority, true
	}
	p, err := strconv.Atoi(v)
	if err != nil || p < -maxPriority || p > maxPriority {
		return 0, false
	}
	if keyed {
		p = min(p, key.priority)
	}
	return p, true
}

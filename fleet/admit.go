package fleet

import (
	"container/heap"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/route"
)

// Admission is admission control: when no replica that could serve a
// request can start its prefill within MaxWait (route.Backlog), the fleet
// is saturated for it, and Decide answers route.ReasonSaturated instead
// of routing it. The caller then holds it in a Queue, where it waits for
// a replica to free (Config.OnRelease) and is decided again, or rejects
// it. Sending it anyway would only queue it inside an engine, bound to
// that replica whichever frees first; holding it in the router keeps the
// choice open until one does. Its YAML keys are kvrouter serve's
// (max-wait, max-queue, queue-timeout); a request the Queue cannot hold,
// or that waits past QueueTimeout, gets 429 with Retry-After, and the
// X-Priority header's highest wait first.
type Admission struct {
	// MaxWait is the longest predicted wait before a request's prefill
	// starts (route.Backlog) that a replica may have and still take it;
	// zero means admission control is off.
	MaxWait time.Duration `yaml:"max-wait"`
	// MeanOutput is the output length, in tokens, Backlog assumes of the
	// requests holding the seats of a full replica; zero means 256.
	MeanOutput int `yaml:"-"`
	// StaleAfter is the age beyond which an engine's scraped load no
	// longer counts in Backlog; zero means DefaultBacklogStale (2 s, twice
	// the age past which kv-aware ignores it, route's kvStaleAfter).
	StaleAfter time.Duration `yaml:"-"`
	// MaxQueue is how many requests the caller's Queue holds; zero means
	// DefaultMaxQueue.
	MaxQueue int `yaml:"max-queue"`
	// QueueTimeout is the longest a request waits in the queue before it
	// is rejected; zero means DefaultQueueTimeout.
	QueueTimeout time.Duration `yaml:"queue-timeout"`
	// SLO is what Decide does with a request whose SLO the policy's
	// choice is predicted to miss at least as likely as not
	// (Unattainable): SLORoute commits it as any other; SLOQueue and
	// SLOReject commit nothing and answer route.ReasonUnattainable, the
	// caller holding it in its Queue (decided again against what remains
	// of its TTFT bound, Remaining) or rejecting it. Empty means SLORoute.
	// kvrouter serve sets it from --slo-admission, kvrouter sim from its
	// own flag of that name.
	SLO string `yaml:"-"`
}

// SLO admission modes (Admission.SLO).
const (
	SLORoute  = "route"
	SLOQueue  = "queue"
	SLOReject = "reject"
)

// MissThreshold is the predicted miss probability (route.Decision.Miss) at
// or above which no replica is predicted to meet a request's SLO: the
// policy's best replica is at least as likely to miss it as to meet it.
// 0.5 is the point where routing the request is a worse bet than not, for
// a request whose miss costs as much as its refusal.
const MissThreshold = 0.5

// Unattainable reports whether decision d, for r, predicts that r misses
// its SLO at least as likely as not (MissThreshold); never for a request
// without an SLO.
func Unattainable(r *Request, d *route.Decision) bool {
	return !r.SLO.IsZero() && d.Miss >= MissThreshold
}

// refuses reports whether Decide holds back decision d for r, committing
// nothing: d is Unattainable, SLO is queue or reject, and r is not
// already admitted.
func (a *Admission) refuses(r *Request, d *route.Decision) bool {
	return (a.SLO == SLOQueue || a.SLO == SLOReject) && !r.Admitted && Unattainable(r, d)
}

// Remaining is slo as a request that arrived waited ago is decided again
// against: its TTFT bound is what remains of it, at least a nanosecond
// (a zero bound is none).
func Remaining(slo route.SLO, waited time.Duration) route.SLO {
	if slo.TTFT > 0 {
		slo.TTFT = max(slo.TTFT-waited, 1)
	}
	return slo
}

// Patience is how long a request queued at waited after its arrival may
// stay queued: the queue's Timeout and, queued for its SLO (forSLO), no
// longer than what remains of its TTFT bound, after which no wait can
// meet it.
func (a *Admission) Patience(slo route.SLO, forSLO bool, waited time.Duration) time.Duration {
	d := a.Timeout()
	if forSLO && slo.TTFT > 0 {
		d = min(d, max(slo.TTFT-waited, 0))
	}
	return d
}

// Validate reports a negative setting, an unknown SLO mode, or SLOQueue
// without the queue (MaxWait zero).
func (a Admission) Validate() error {
	if a.MaxWait < 0 || a.MaxQueue < 0 || a.QueueTimeout < 0 || a.MeanOutput < 0 || a.StaleAfter < 0 {
		return fmt.Errorf("max-wait, max-queue, queue-timeout: must not be negative, got %s, %d, %s", a.MaxWait, a.MaxQueue, a.QueueTimeout)
	}
	switch a.SLO {
	case "", SLORoute, SLOReject:
	case SLOQueue:
		if a.MaxWait <= 0 {
			return errors.New("slo-admission queue: needs the router's queue (max-wait above 0)")
		}
	default:
		return fmt.Errorf("slo-admission %q: want route, queue or reject", a.SLO)
	}
	return nil
}

// Defaults of the live router's and the simulator's admission control
// (Admission's zero value is off).
const (
	// DefaultMaxWait is the predicted wait past which a replica takes no
	// more requests: far above any healthy queue, so that only a fleet
	// that cannot keep up queues in the router.
	DefaultMaxWait = 30 * time.Second
	// DefaultMaxQueue is the queue's capacity.
	DefaultMaxQueue = 1024
	// DefaultQueueTimeout is the longest wait in the queue.
	DefaultQueueTimeout = 30 * time.Second
	// DefaultBacklogStale is the age beyond which Backlog ignores an
	// engine's scraped load (Admission.StaleAfter).
	DefaultBacklogStale = 2 * time.Second
)

// Capacity returns MaxQueue, or its default.
func (a *Admission) Capacity() int {
	if a.MaxQueue > 0 {
		return a.MaxQueue
	}
	return DefaultMaxQueue
}

// Timeout returns QueueTimeout, or its default.
func (a *Admission) Timeout() time.Duration {
	if a.QueueTimeout > 0 {
		return a.QueueTimeout
	}
	return DefaultQueueTimeout
}

// released calls Config.OnRelease.
func (f *Fleet) released() {
	if h := f.cfg.OnRelease; h != nil {
		h()
	}
}

// saturated reports whether every healthy replica of snap has a backlog
// above MaxWait for a request of tokens prompt tokens. A fleet with no
// healthy replica is not saturated (the policy says there is none). It
// stops at the first replica that can take the request.
func (a *Admission) saturated(snap *route.Snapshot, tokens int) bool {
	if a.MaxWait <= 0 {
		return false
	}
	any := false
	for i := range snap.Replicas {
		rp := &snap.Replicas[i]
		if !rp.Healthy {
			continue
		}
		if a.Backlog(rp, tokens) <= a.MaxWait {
			return false
		}
		any = true
	}
	return any
}

// Backlog is route.Backlog of a request of tokens prompt tokens on rp,
// with a's MeanOutput and StaleAfter.
func (a *Admission) Backlog(rp *route.Replica, tokens int) time.Duration {
	out, stale := a.MeanOutput, a.StaleAfter
	if out <= 0 {
		out = 256
	}
	if stale <= 0 {
		stale = DefaultBacklogStale
	}
	return route.Backlog(rp, tokens, out, stale)
}

// Queue holds requests waiting for a replica while the fleet is
// saturated: the highest Priority first, then the first queued; at most
// its capacity. The live router queues its waiting requests' handles, the
// simulator its jobs. Its methods are safe for concurrent use.
type Queue[T any] struct {
	mu  sync.Mutex
	cap int
	h   entries[T]
	seq uint64
}

// Entry is one queued request. Since is when it was first queued; an
// entry popped and pushed again keeps its place among equal priorities.
type Entry[T any] struct {
	Value    T
	Priority int
	Since    time.Time
	seq      uint64
	index    int // in the heap; −1 when not queued
}

// NewQueue returns an empty queue holding at most capacity entries
// (at least 1).
func NewQueue[T any](capacity int) *Queue[T] {
	return &Queue[T]{cap: max(capacity, 1)}
}

// Push queues e. When the queue is full, e displaces the last entry (the
// lowest priority, queued last) if it outranks it; out is the entry left
// out, that one or e itself, nil when there was room.
func (q *Queue[T]) Push(e *Entry[T]) (out *Entry[T]) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if e.seq == 0 {
		q.seq++
		e.seq = q.seq
	}
	if len(q.h) >= q.cap {
		last := q.h.last()
		if !q.h.before(e, q.h[last]) {
			e.index = -1
			return e
		}
		out = q.h[last]
		heap.Remove(&q.h, last)
	}
	heap.Push(&q.h, e)
	return out
}

// Pop removes and returns the first entry, nil when the queue is empty.
func (q *Queue[T]) Pop() *Entry[T] {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.h) == 0 {
		return nil
	}
	return heap.Pop(&q.h).(*Entry[T])
}

// Remove takes e out of the queue and reports whether it was in it.
func (q *Queue[T]) Remove(e *Entry[T]) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if e.index < 0 || e.index >= len(q.h) || q.h[e.index] != e {
		return false
	}
	heap.Remove(&q.h, e.index)
	return true
}

// Len returns how many entries are queued.
func (q *Queue[T]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.h)
}

// entries is a heap of entries, first the highest priority then the
// lowest seq.
type entries[T any] []*Entry[T]

func (h entries[T]) before(a, b *Entry[T]) bool {
	if a.Priority != b.Priority {
		return a.Priority > b.Priority
	}
	return a.seq < b.seq
}

// last returns the index of the entry every other one comes before.
func (h entries[T]) last() int {
	k := 0
	for i := range h {
		if h.before(h[k], h[i]) {
			k = i
		}
	}
	return k
}

func (h entries[T]) Len() int           { return len(h) }
func (h entries[T]) Less(i, j int) bool { return h.before(h[i], h[j]) }
func (h entries[T]) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *entries[T]) Push(x any) {
	e := x.(*Entry[T])
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *entries[T]) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	e.index = -1
	*h = old[:len(old)-1]
	return e
}

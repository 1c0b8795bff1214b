package sim

import "time"

// kind says what an event does when it fires.
type kind uint8

// Event kinds, in the order they fire when due at the same instant: a wake
// (engine step) before a fleet event before a scrape before an arrival,
// so that an arrival sees everything that happened by its time.
const (
	evWake    kind = iota // engine step of replica rep
	evFleet               // fleet event idx (kill / add a replica)
	evScrape              // scrape tick: refresh engine metrics in the snapshot
	evSync                // the routers exchange their shares (routers.go)
	evArrival             // arrival of job idx (or a re-routed one)
)

// event is one entry of the queue: small and pointer-free, so the heap
// stays cheap to sift.
type event struct {
	at   time.Duration
	seq  uint64 // push order: ties fire first-in first-out
	kind kind
	rep  int32
	idx  int32
}

// before orders events by time, then kind, then push order.
func (a *event) before(b *event) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	if a.kind != b.kind {
		return a.kind < b.kind
	}
	return a.seq < b.seq
}

// queue is a hand-rolled binary min-heap of events (container/heap would box
// every event in an interface).
type queue struct {
	ev  []event
	seq uint64
}

func (q *queue) len() int { return len(q.ev) }

// push adds an event.
func (q *queue) push(e event) {
	q.seq++
	e.seq = q.seq
	q.ev = append(q.ev, e)
	i := len(q.ev) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !q.ev[i].before(&q.ev[p]) {
			break
		}
		q.ev[i], q.ev[p] = q.ev[p], q.ev[i]
		i = p
	}
}

// pop removes and returns the earliest event; the queue must not be empty.
func (q *queue) pop() event {
	top := q.ev[0]
	n := len(q.ev) - 1
	q.ev[0] = q.ev[n]
	q.ev = q.ev[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && q.ev[r].before(&q.ev[l]) {
			m = r
		}
		if !q.ev[m].before(&q.ev[i]) {
			break
		}
		q.ev[i], q.ev[m] = q.ev[m], q.ev[i]
		i = m
	}
	return top
}

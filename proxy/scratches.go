package proxy

import (
	"sync"

	"github.com/kvrouter/kvrouter/fleet"
)

// scratchList keeps the decision scratches (fleet.Scratch) that calls
// borrow from their first decision to their end, apart from the call
// pool: a sync.Pool, which the garbage collector empties, would make the
// next decision allocate a snapshot of every replica anew, and refresh
// it whole. It keeps at most maxIdleScratches, the most recently given
// back first (their snapshots are the freshest). The zero value is empty
// and ready.
type scratchList struct {
	// mu guards idle.
	mu   sync.Mutex
	idle []*fleet.Scratch
}

// maxIdleScratches bounds the scratches a router keeps between calls:
// past it, one given back is left to the garbage collector.
const maxIdleScratches = 64

// get returns an idle scratch, or a new one.
func (l *scratchList) get() *fleet.Scratch {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(l.idle)
	if n == 0 {
		return new(fleet.Scratch)
	}
	s := l.idle[n-1]
	l.idle[n-1] = nil
	l.idle = l.idle[:n-1]
	return s
}

// put gives s back; the caller no longer reads it.
func (l *scratchList) put(s *fleet.Scratch) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.idle) < maxIdleScratches {
		l.idle = append(l.idle, s)
	}
}

// noDecision is what seen returns before a call's first decision.
var noDecision fleet.Scratch

// seen is what the call's last decision saw and chose (its Snapshot and
// Request); empty before its first decision. Read only.
func (c *call) seen() *fleet.Scratch {
	if c.sc == nil {
		return &noDecision
	}
	return c.sc
}

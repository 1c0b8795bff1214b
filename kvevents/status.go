package kvevents

import (
	"sync/atomic"
	"time"
)

// Status is the health of one replica's event stream, as of the moment it
// was read.
type Status struct {
	// Replica is the residency replica id.
	Replica int
	// Connected is true while the SUB connection to the engine is up
	// (connect mode), or, in bind mode, while a connection that delivered
	// one of the replica's messages is open.
	Connected bool
	// LastEvent is when the last batch arrived (zero if none).
	LastEvent time.Time
	// Events counts events applied (one per BlockStored, BlockRemoved or
	// AllBlocksCleared); Stored and Removed count their blocks.
	Events, Stored, Removed uint64
	// Batches counts messages (live or replayed) applied or dropped as
	// undecodable, each after the other counters it changes.
	Batches uint64
	// Gaps counts sequence gaps seen (seq > expected).
	Gaps uint64
	// Replays counts replay requests answered with the missing batches.
	Replays uint64
	// Resets counts times the replica's entries were dropped: an
	// AllBlocksCleared, an engine restart (sequence back to a lower
	// number, or a reconnect whose replay starts again at the publisher's
	// first batch), or a gap replay could not fill.
	Resets uint64
	// Orphans counts stored blocks skipped because their parent block was
	// unknown (the subscriber joined mid-stream or lost events).
	Orphans uint64
	// DecodeErrors counts messages that did not decode; they change
	// nothing in the index.
	DecodeErrors uint64
	// Blocks is the engine blocks the replica's chain knows, on any
	// medium.
	Blocks int
	// Offloaded is the engine blocks, of Blocks, held only on non-GPU
	// media (CPU, disk, ...): known, so that blocks chained onto them are
	// keyed, but not in the index.
	Offloaded int
	// BlockSize is the engine's tokens per block as its BlockStored events
	// report it (block_size; of KV-cache group 0 when a hybrid model's
	// groups differ); zero until a BlockStored arrived. It is one source of
	// the replica's block size, the other its cache_config_info metric.
	BlockSize int
	// Stale is true when the router expected events from the replica
	// (Subscriber.Expect) longer than Config.StaleAfter ago and none came
	// since, or when it is not connected.
	Stale bool
}

// Healthy reports whether the router can trust the index for this
// replica: connected and not stale. Otherwise the router should fall back
// to approximate tracking for it.
func (s Status) Healthy() bool { return s.Connected && !s.Stale }

// counters are one replica's live counters, written by its goroutines and
// read concurrently.
type counters struct {
	connected atomic.Bool
	conns     atomic.Int32 // open connections bound to the replica
	lastEvent atomic.Int64 // unix nanoseconds of the last batch, 0 if none
	expected  atomic.Int64 // unix nanoseconds of the oldest unanswered Expect, 0 if none

	events, stored, removed, batches, gaps, replays, resets, orphans, decodeErrors atomic.Uint64
	blocks, offloaded, blockSize                                                   atomic.Int64
}

// expect notes that events are expected from now on (keeps the oldest).
func (c *counters) expect(now time.Time) {
	c.expected.CompareAndSwap(0, now.UnixNano())
}

// arrived notes a batch that arrived at now: it answers expectations made
// before it.
func (c *counters) arrived(now time.Time) {
	t := now.UnixNano()
	c.lastEvent.Store(t)
	if e := c.expected.Load(); e != 0 && e <= t {
		c.expected.CompareAndSwap(e, 0)
	}
}

func (c *counters) count(n applied) {
	c.events.Add(uint64(n.events))
	c.stored.Add(uint64(n.stored))
	c.removed.Add(uint64(n.removed))
	c.orphans.Add(uint64(n.orphans))
	c.resets.Add(uint64(n.resets))
}

// snapshot reads the counters; staleAfter judges Stale at now.
func (c *counters) snapshot(replica int, now time.Time, staleAfter time.Duration) Status {
	s := Status{
		Replica:      replica,
		Connected:    c.connected.Load(),
		Events:       c.events.Load(),
		Stored:       c.stored.Load(),
		Removed:      c.removed.Load(),
		Batches:      c.batches.Load(),
		Gaps:         c.gaps.Load(),
		Replays:      c.replays.Load(),
		Resets:       c.resets.Load(),
		Orphans:      c.orphans.Load(),
		DecodeErrors: c.decodeErrors.Load(),
		Blocks:       int(c.blocks.Load()),
		Offloaded:    int(c.offloaded.Load()),
		BlockSize:    int(c.blockSize.Load()),
	}
	if t := c.lastEvent.Load(); t != 0 {
		s.LastEvent = time.Unix(0, t)
	}
	e := c.expected.Load()
	s.Stale = !s.Connected || (e != 0 && now.Sub(time.Unix(0, e)) > staleAfter)
	return s
}

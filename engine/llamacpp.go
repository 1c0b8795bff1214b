package engine

import (
	"time"

	"github.com/kvrouter/kvrouter/slots"
)

// A llama.cpp engine (Config.Kind KindLlamaCpp) keeps no block cache: its
// MaxNumSeqs slots each keep their last request's tokens, and a request
// reuses the longest common prefix of the slot llama-server gives it, or
// of the prompt that slot loads from the host prompt cache (package
// slots, the rules the router's model of a llama.cpp replica follows
// too). The rest of the engine is the same: the FCFS queue (llama.cpp's
// deferred tasks, each taking the first slot freed), the batch of slots
// stepping together within the token budget (-b), the timing model.
// Blocks still count the context the slots hold, but they are never
// cached in the pool: a llama.cpp engine reports no KV event, and a
// prompt's reuse is its slot's, nothing else.

// newSlots is the slot model of a llama.cpp engine of cfg (defaults
// filled); nil for another engine.
func newSlots(cfg *Config) *slots.Cache {
	if cfg.Kind != KindLlamaCpp {
		return nil
	}
	c := &slots.Cache{Similarity: cfg.SlotSimilarity, LimitBlocks: max(cfg.HostCacheTokens/cfg.BlockSize, 1)}
	c.Resize(cfg.MaxNumSeqs)
	return c
}

// admitSlot admits s, the front of the queue, into a slot within budget,
// as llama-server launches a task: it reports false, changing nothing,
// when no slot is idle or the blocks of its reused prefix and first chunk
// are not free. Reuse never covers the whole prompt (llama.cpp evaluates
// its last token again).
func (e *Engine) admitSlot(now time.Duration, s *seq, budget int) bool {
	bs := e.cfg.BlockSize
	total := s.prompt + s.output
	limit := min(len(s.hashes), (s.prompt-1)/bs)
	hits := min(e.slots.Predict(s.hashes), limit)
	n := min(total-hits*bs, budget)
	if !e.slots.Idle() || (hits*bs+n+bs-1)/bs > e.pool.nfree {
		return false
	}
	// The slot keeps the prompt's blocks, then what follows them (the
	// prompt's partial block, the output) as blocks that match nothing.
	extra := max((s.prompt+s.maxTokens+bs-1)/bs-len(s.hashes), 0)
	slot, reused := e.slots.Start(s.hashes, extra)
	hits = min(reused, limit)
	n = min(total-hits*bs, budget)
	e.waiting.popFront()
	s.slot = slot
	s.blocks = s.blocks[:0]
	s.computed = hits * bs
	s.stored = len(s.hashes) // nothing to offer a block cache
	e.grow(s, n)
	e.stats.PrefixQueries += int64(s.prompt)
	e.stats.PrefixHits += int64(hits * bs)
	if s.preemptions == 0 {
		s.cached, s.started = hits*bs, now
	}
	s.admitted = true
	e.running = append(e.running, s)
	s.n = n
	e.batch = append(e.batch, s)
	return true
}

// releaseSlot frees s's slot, keeping what it holds.
func (e *Engine) releaseSlot(s *seq) {
	if e.slots != nil && s.slot >= 0 {
		e.slots.Release(s.slot)
		s.slot = -1
	}
}

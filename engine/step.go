package engine

import (
	"time"
)

// Step advances the engine to now. If the iteration in flight ended by
// now, Step completes it and returns its events, stamped with its end
// time (and any events of Cancel and Reset since the last Step). Then, if
// no iteration is in flight and there is work, it schedules the next one,
// starting at now. Held blocks due by now are freed first (hold.go). next
// is when to call Step again: the end of the iteration in flight, else the
// first load or hold due, or Idle when there is nothing to wait for.
//
// The returned slice is reused by the next Step call: copy what you keep.
// So is the Hashes slice of a BlockRemoved event; the Hashes and TokenIDs
// of a BlockStored event alias the Request's own Hashes and Tokens.
//
// Within one iteration's events, BlockRemoved (blocks evicted to make room
// for it) comes first, then for each request in batch order its
// BlockStored, its FirstToken or Token, and its Done.
func (e *Engine) Step(now time.Duration) (events []Event, next time.Duration) {
	// The pending events hold cpuEvicted; this Step's new ones go to the
	// array the last Step's events held.
	e.cpuEvicted, e.cpuSpare = e.cpuSpare[:0], e.cpuEvicted
	if e.busy && e.end <= now {
		e.finish()
	}
	e.release(now)
	if !e.busy {
		e.schedule(now)
	}
	e.out, e.pend = e.pend, e.out[:0]
	switch {
	case e.busy:
		return e.out, e.end
	case e.loads > 0:
		return e.out, min(e.nextLoaded(), e.holdNext)
	}
	return e.out, e.holdNext
}

// nextLoaded is when the first of the loads from the CPU tier completes.
func (e *Engine) nextLoaded() time.Duration {
	next := Idle
	for _, s := range e.running {
		if s.loading > 0 {
			next = min(next, s.loadedAt)
		}
	}
	return next
}

// schedule picks the next iteration's batch as vLLM v1's Scheduler.schedule
// (vllm/v1/core/sched/scheduler.py): running requests first, in order,
// each taking what it still needs within the token budget (one token for a
// decode, a chunk for a prefill); when blocks run out, the newest running
// request is preempted; then, if nothing was preempted, waiting requests
// are admitted in FCFS order with their cached prefix while seats, budget
// and blocks last.
func (e *Engine) schedule(now time.Duration) {
	e.batch = e.batch[:0]
	budget := e.cfg.MaxBatchedTokens
	preempted := false
	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		if s.loading > 0 {
			if s.loadedAt > now {
				continue // its blocks are still crossing the link
			}
			e.loaded(s, now)
		}
		n := min(s.need(), budget)
		for !e.grow(s, n) {
			v := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(v)
			preempted = true
			if v == s {
				break
			}
		}
		if !s.admitted {
			break
		}
		s.n = n
		budget -= n
		e.batch = append(e.batch, s)
	}
	if !preempted || len(e.batch) == 0 {
		// vLLM admits nobody in a step that preempted; an empty batch
		// cannot arise (Add rejects requests larger than the cache), but
		// admitting then keeps the engine from stalling.
		e.admit(now, budget)
	}
	if len(e.batch) == 0 {
		return
	}
	e.busy = true
	e.start = now
	e.end = now + e.duration()
	e.stats.Steps++
	e.stats.Busy += e.end - now
}

// admit moves waiting requests into the batch.
func (e *Engine) admit(now time.Duration, budget int) {
	bs := e.cfg.BlockSize
	for e.waiting.len() > 0 && len(e.running) < e.cfg.MaxNumSeqs && budget > 0 {
		s := e.waiting.front()
		if e.slots != nil {
			if !e.admitSlot(now, s, budget) {
				return
			}
			budget -= s.n
			continue
		}
		total := s.prompt + s.output
		// Longest chain of computed cached blocks; never the whole prompt,
		// as vLLM recomputes the last token to get its logits.
		// The hit blocks go straight into the block table; evictable ones
		// (in the free queue) count against the free blocks.
		limit := min(len(s.hashes), (total-1)/bs)
		s.blocks = s.blocks[:0]
		evictable := 0
		for len(s.blocks) < limit {
			i, ok := e.pool.lookup(s.hashes[len(s.blocks)])
			if !ok {
				break
			}
			if e.pool.blocks[i].ref == 0 {
				evictable++
			}
			s.blocks = append(s.blocks, i)
		}
		hits := len(s.blocks)
		// Then the blocks the CPU tier holds, and those a peer sends:
		// loaded, not computed.
		fromCPU := e.onCPU(s, hits, limit)
		fromPeer := max(min(s.remote, limit)-hits-fromCPU, 0)
		loads := fromCPU + fromPeer
		n := min(total-hits*bs, budget)
		if loads > 0 {
			n = loads * bs // blocks to hold; nothing computed this step
		}
		if (hits*bs+n+bs-1)/bs-hits+evictable > e.pool.nfree {
			s.blocks = s.blocks[:0]
			return
		}
		e.waiting.popFront()
		for _, i := range s.blocks {
			e.pool.touch(i)
			if e.cpu != nil {
				e.cpu.touch(e.pool.blocks[i].hash)
			}
		}
		s.computed = hits * bs
		s.stored = hits
		e.grow(s, n)
		e.stats.PrefixQueries += int64(total)
		e.stats.PrefixHits += int64(hits * bs)
		if e.cpu != nil {
			e.stats.CPUQueries += int64(total - hits*bs)
			e.stats.CPUHits += int64(fromCPU * bs)
		}
		e.stats.RemoteHits += int64(fromPeer * bs)
		if s.preemptions == 0 {
			s.cached, s.cpuCached, s.remoteCached = (hits+loads)*bs, fromCPU*bs, fromPeer*bs
			s.started = now
		}
		s.admitted = true
		e.running = append(e.running, s)
		if loads > 0 {
			s.loading, s.loadedAt = loads, e.loadBoth(now, s, fromCPU, fromPeer)
			e.loads++
			continue
		}
		s.n = n
		budget -= n
		e.batch = append(e.batch, s)
	}
}

// onCPU is how many of s's prompt blocks after its first hits, up to
// limit, the CPU tier holds in a row.
func (e *Engine) onCPU(s *seq, hits, limit int) int {
	if e.cpu == nil {
		return 0
	}
	n := 0
	for hits+n < limit && e.cpu.has(s.hashes[hits+n]) {
		n++
	}
	return n
}

// loadBoth queues s's loads, fromCPU blocks over PCIe and fromPeer over
// the interconnect (no earlier than the peer sent them), side by side,
// and returns when both are done. The peer's blocks are received once: a
// preempted request recomputes them.
func (e *Engine) loadBoth(now time.Duration, s *seq, fromCPU, fromPeer int) time.Duration {
	done := now
	if fromCPU > 0 {
		done = e.cpu.pcie.reserve(now, fromCPU)
	}
	if fromPeer > 0 {
		done = max(done, s.remoteSent, e.netIn.reserve(now, fromPeer))
	}
	s.remote = 0
	return done
}

// loaded ends s's load from the CPU tier at now: its loaded blocks count
// as computed, and are cached on the GPU again (BlockStored).
func (e *Engine) loaded(s *seq, now time.Duration) {
	s.computed += s.loading * e.cfg.BlockSize
	s.loading = 0
	e.loads--
	e.store(s, now)
}

// grow gives s the blocks for n more tokens, evicting cached free blocks
// as needed. It reports false, changing nothing, if too few are free.
func (e *Engine) grow(s *seq, n int) bool {
	bs := e.cfg.BlockSize
	want := (s.computed+n+bs-1)/bs - len(s.blocks)
	if want <= 0 {
		return true
	}
	if want > e.pool.nfree {
		return false
	}
	for range want {
		var i int32
		i, e.evicted = e.pool.alloc(e.evicted)
		s.blocks = append(s.blocks, i)
	}
	return true
}

// preempt frees s's blocks and puts it back at the front of the queue, to
// recompute from scratch (vLLM's preemption by recompute).
func (e *Engine) preempt(s *seq) {
	e.free(s) // and any load in flight: its link time is spent
	s.computed = 0
	s.stored = 0
	s.admitted = false
	s.preemptions++
	e.stats.Preemptions++
	e.waiting.pushFront(s)
}

// duration is the iteration's length under the timing model.
func (e *Engine) duration() time.Duration {
	c := &e.cfg
	var prefill, pairs, decodes, ctx int64
	for _, s := range e.batch {
		n := int64(s.n)
		if n == 1 && s.output > 0 {
			decodes++
			ctx += int64(s.computed + 1)
			continue
		}
		prefill += n
		pairs += n * (int64(s.computed) + n/2)
	}
	d := c.StepOverhead + time.Duration(prefill)*c.PrefillPerToken +
		time.Duration(pairs*int64(c.AttnPerMPairs)/1_000_000)
	if decodes > 0 {
		d += c.DecodeStep + time.Duration(decodes)*c.DecodePerSeq +
			time.Duration(ctx*int64(c.DecodePerMTokens)/1_000_000)
	}
	return d
}

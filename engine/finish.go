package engine

import "time"

// finish completes the iteration in flight at e.end: the evicted blocks are
// reported, each request's new full prompt blocks become reusable
// (BlockStored), requests that computed all their tokens sample one, and
// requests that reached MaxTokens finish and free their blocks (or hold
// them, hold.go).
func (e *Engine) finish() {
	t := e.end
	e.busy = false
	if len(e.evicted) > 0 {
		e.stats.RemovedBlocks += int64(len(e.evicted))
		e.pend = append(e.pend, Event{Kind: BlockRemoved, At: t, Hashes: e.evicted, BlockSize: e.cfg.BlockSize})
		// The event keeps this array until the next Step; the next
		// evictions go to the other one.
		e.evicted, e.spare = e.spare[:0], e.evicted
	}
	finished := false
	for _, s := range e.batch {
		if s.gone || !s.admitted {
			continue
		}
		if s.computed < s.prompt {
			e.stats.PrefillTokens += int64(min(s.computed+s.n, s.prompt) - s.computed)
		}
		s.computed += s.n
		if s.stored < len(s.hashes) && s.computed/e.cfg.BlockSize > s.stored {
			e.store(s, t)
		}
		if s.computed < s.prompt+s.output {
			continue // a prefill chunk short of the end
		}
		s.output++
		e.stats.OutputTokens++
		switch {
		case s.output == 1:
			s.first = t
			e.pend = append(e.pend, Event{Kind: FirstToken, At: t, Req: s.id})
		case !e.cfg.NoTokenEvents:
			e.pend = append(e.pend, Event{Kind: Token, At: t, Req: s.id})
		}
		if s.output >= s.maxTokens {
			held := e.keep(s, t)
			s.admitted = false
			e.stats.Finished++
			e.done(s, t, false, held)
			finished = true
		}
	}
	if finished {
		e.running = compact(e.running)
	}
}

// compact drops finished requests from the running batch, keeping order.
func compact(running []*seq) []*seq {
	k := 0
	for _, s := range running {
		if !s.gone {
			running[k] = s
			k++
		}
	}
	clear(running[k:])
	return running[:k]
}

// store offers s's newly computed full prompt blocks to the cache and
// reports those that became reusable, one BlockStored event per run of
// consecutive blocks.
func (e *Engine) store(s *seq, t time.Duration) {
	if e.slots != nil {
		return // a llama.cpp engine caches in its slots (llamacpp.go)
	}
	bs := e.cfg.BlockSize
	upto := min(s.computed/bs, len(s.hashes))
	run := -1 // first block of the current run
	flush := func(end int) {
		if run < 0 {
			return
		}
		ev := Event{Kind: BlockStored, At: t, Hashes: s.hashes[run:end], BlockSize: bs, LoRA: s.lora}
		if run > 0 {
			ev.Parent, ev.HasParent = s.hashes[run-1], true
		}
		if s.tokens != nil {
			ev.TokenIDs = s.tokens[run*bs : end*bs]
		}
		e.stats.StoredBlocks += int64(end - run)
		e.pend = append(e.pend, ev)
		run = -1
	}
	for i := s.stored; i < upto; i++ {
		if e.pool.store(s.blocks[i], s.hashes[i]) {
			if run < 0 {
				run = i
			}
			continue
		}
		flush(i)
	}
	flush(upto)
	if e.cpu != nil {
		e.offload(s, s.stored, upto, t)
	}
	s.stored = upto
}

// offload copies s's prompt blocks from..upto, just computed or loaded,
// to the CPU tier (write-through), reporting the blocks it dropped for
// room (BlockRemoved on CPU) and then the new ones (BlockStored on CPU,
// one event per run), as vLLM's offloading connector does.
func (e *Engine) offload(s *seq, from, upto int, t time.Duration) {
	bs := e.cfg.BlockSize
	gone := len(e.cpuEvicted)
	type span struct{ from, to int }
	var runs [4]span // most stores are one run; more spill to the heap
	added := runs[:0]
	for i := from; i < upto; i++ {
		isNew, victim, evicted := e.cpu.put(s.hashes[i])
		if evicted {
			e.cpuEvicted = append(e.cpuEvicted, victim)
		}
		switch {
		case !isNew:
		case len(added) > 0 && added[len(added)-1].to == i:
			added[len(added)-1].to = i + 1
		default:
			added = append(added, span{i, i + 1})
		}
	}
	if len(e.cpuEvicted) > gone {
		e.pend = append(e.pend, Event{Kind: BlockRemoved, At: t, Medium: CPU, Hashes: e.cpuEvicted[gone:], BlockSize: bs})
	}
	for _, r := range added {
		ev := Event{Kind: BlockStored, At: t, Medium: CPU, Hashes: s.hashes[r.from:r.to], BlockSize: bs, LoRA: s.lora}
		if r.from > 0 {
			ev.Parent, ev.HasParent = s.hashes[r.from-1], true
		}
		if s.tokens != nil {
			ev.TokenIDs = s.tokens[r.from*bs : r.to*bs]
		}
		e.pend = append(e.pend, ev)
	}
}

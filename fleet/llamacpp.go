package fleet

import (
	"slices"
	"sync"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/scrape"
)

// llama.cpp's llama-server does not keep a block cache as vLLM does. Each
// of its slots (the sequences it runs at once) keeps the tokens of its
// last request; a new request takes the idle slot whose tokens share the
// longest common prefix with its prompt, if that prefix is more than
// --slot-prompt-similarity (0.1) of the prompt, else the least recently
// used idle slot, and reuses the common prefix. A host-memory prompt
// cache (--cache-ram) keeps whole prompts: the prompts of the idle slots,
// saved when a request starts, and a slot's prompt when a request takes
// it by LRU or keeps less than half of it; such a slot first loads from
// that cache the saved prompt that shares more with the request than its
// own (one that keeps at least a quarter of it). A request that finds no
// idle slot waits (requests_deferred) and takes the first slot freed.
// (tools/server/server-context.cpp, get_available_slot;
// server-task.cpp, server_prompt_cache.)
//
// slotCache follows that per llama.cpp replica, over the prompts'
// block-hash chains, so that the prefix a request is predicted to reuse
// there is what the engine reuses, not what the residency index believes
// resident anywhere in it. It knows prompts, not the tokens the engine
// generated after them: a slot's tokens are its prompt's blocks, plus its
// expected output as blocks that match nothing.

// slotSimilarity is llama-server's --slot-prompt-similarity default.
const slotSimilarity = 0.1

// slotCache is one llama.cpp replica's slots and host prompt cache.
type slotCache struct {
	// mu guards everything below.
	mu    sync.Mutex
	slots []slotState
	// saved is the host prompt cache, oldest first.
	saved []savedPrompt
	// deferred are the prompts committed while every slot was busy, in
	// order: each takes the next slot freed.
	deferred []*slotClaim
	// clock orders slot use (LRU).
	clock uint64
}

// slotState is one slot: the chain of its last prompt, its generated
// blocks after it, whether a request runs in it, and when it was last
// taken.
type slotState struct {
	chain []prefix.Hash
	extra int
	busy  bool
	used  uint64
}

// length is the slot's tokens in blocks.
func (s *slotState) length() int { return len(s.chain) + s.extra }

// savedPrompt is a prompt in the host cache.
type savedPrompt struct {
	chain []prefix.Hash
	extra int
}

// slotClaim is a request's hold on a slot, released when it ends.
type slotClaim struct {
	chain []prefix.Hash
	extra int
	slot  int // -1 while deferred
	done  bool
}

// lcp is the common prefix of two chains, in blocks (chained hashes: the
// first difference ends it).
func lcp(a, b []prefix.Hash) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// resize sets the slot count (llama.cpp's /slots), keeping what the first
// slots hold.
func (c *slotCache) resize(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.slots) < n {
		c.slots = append(c.slots, slotState{})
	}
	if len(c.slots) > n {
		c.slots = c.slots[:n]
	}
}

// pick is the slot llama.cpp gives a prompt of chain now, and whether it
// first saves the slot's prompt and loads a better one from the host
// cache; -1 when no slot is idle. mu is held.
func (c *slotCache) pickLocked(chain []prefix.Hash) (slot int, update bool) {
	best, bestSim := -1, 0.0
	for i := range c.slots {
		s := &c.slots[i]
		if s.busy || s.length() == 0 || len(chain) == 0 {
			continue
		}
		sim := float64(lcp(s.chain, chain)) / float64(len(chain))
		if sim > bestSim && sim > slotSimilarity {
			best, bestSim = i, sim
		}
	}
	if best >= 0 {
		keep := bestSim * float64(len(chain)) / float64(c.slots[best].length())
		return best, keep < 0.5
	}
	for i := range c.slots {
		if s := &c.slots[i]; !s.busy && (best < 0 || s.used <= c.slots[best].used) {
			best = i
		}
	}
	return best, best >= 0
}

// loadable is the saved prompt a slot holding s would load for chain, -1
// for none (server_prompt_cache::load). mu is held.
func (c *slotCache) loadableLocked(s *slotState, chain []prefix.Hash) int {
	if len(chain) == 0 {
		return -1
	}
	l := lcp(s.chain, chain)
	keepBest, simBest := -1.0, float64(l)/float64(len(chain))
	if s.length() > 0 {
		keepBest = float64(l) / float64(s.length())
	}
	best := -1
	for i, p := range c.saved {
		n := len(p.chain) + p.extra
		if n == 0 {
			continue
		}
		l := lcp(p.chain, chain)
		keep, sim := float64(l)/float64(n), float64(l)/float64(len(chain))
		if keep < 0.25 {
			continue
		}
		if keepBest < keep && simBest < sim {
			keepBest, simBest, best = keep, sim, i
		}
	}
	return best
}

// predict is the blocks of chain llama.cpp would reuse were the prompt
// sent now: from the slot it would take, or the saved prompt that slot
// would load; with every slot busy, from the best any slot or saved
// prompt holds (the request waits for a slot).
func (c *slotCache) predict(chain []prefix.Hash) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, update := c.pickLocked(chain)
	if i < 0 {
		best := 0
		for _, s := range c.slots {
			best = max(best, lcp(s.chain, chain))
		}
		for _, p := range c.saved {
			best = max(best, lcp(p.chain, chain))
		}
		return best
	}
	s := &c.slots[i]
	if update {
		if j := c.loadableLocked(s, chain); j >= 0 {
			return lcp(c.saved[j].chain, chain)
		}
	}
	return lcp(s.chain, chain)
}

// take commits a prompt of chain with extra generated blocks: it takes a
// slot as llama.cpp would (or waits for one) and returns its claim.
func (c *slotCache) take(chain []prefix.Hash, extra int) *slotClaim {
	c.mu.Lock()
	defer c.mu.Unlock()
	cl := &slotClaim{chain: slices.Clone(chain), extra: extra, slot: -1}
	if !c.startLocked(cl) {
		c.deferred = append(c.deferred, cl)
	}
	return cl
}

// startLocked puts cl in the slot llama.cpp gives it, saving and loading
// prompts as it does, then saves every other idle slot's prompt; false
// when no slot is idle. mu is held.
func (c *slotCache) startLocked(cl *slotClaim) bool {
	i, update := c.pickLocked(cl.chain)
	if i < 0 {
		return false
	}
	s := &c.slots[i]
	if update {
		c.saveLocked(s.chain, s.extra)
		if j := c.loadableLocked(s, cl.chain); j >= 0 {
			c.saved = append(c.saved[:j], c.saved[j+1:]...)
		}
	}
	c.clock++
	*s = slotState{chain: cl.chain, extra: cl.extra, busy: true, used: c.clock}
	cl.slot = i
	for k := range c.slots {
		if o := &c.slots[k]; !o.busy {
			c.saveLocked(o.chain, o.extra) // --cache-idle-slots
		}
	}
	return true
}

// maxSaved bounds the host cache's prompts kept (llama.cpp bounds it by
// --cache-ram, 8 GiB by default: more prompts than a router routes to one
// replica between two of its evictions, for small models).
const maxSaved = 256

// saveLocked adds a prompt to the host cache unless a saved one holds it
// whole, dropping those it holds whole (server_prompt_cache::alloc). mu
// is held.
func (c *slotCache) saveLocked(chain []prefix.Hash, extra int) {
	if len(chain) == 0 {
		return
	}
	for _, p := range c.saved {
		if lcp(p.chain, chain) == len(chain) {
			return
		}
	}
	kept := c.saved[:0]
	for _, p := range c.saved {
		if lcp(p.chain, chain) < len(p.chain) {
			kept = append(kept, p)
		}
	}
	c.saved = append(kept, savedPrompt{chain: chain, extra: extra})
	if len(c.saved) > maxSaved {
		c.saved = c.saved[len(c.saved)-maxSaved:]
	}
}

// release ends cl: its slot is idle again, and the first deferred prompt
// takes a slot.
func (c *slotCache) release(cl *slotClaim) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl.done {
		return
	}
	cl.done = true
	if cl.slot < 0 {
		for i, d := range c.deferred {
			if d == cl {
				c.deferred = append(c.deferred[:i], c.deferred[i+1:]...)
				break
			}
		}
		return
	}
	if cl.slot < len(c.slots) {
		c.slots[cl.slot].busy = false
	}
	for len(c.deferred) > 0 && c.startLocked(c.deferred[0]) {
		c.deferred = c.deferred[1:]
	}
}

// observeSlots makes r follow llama.cpp's slots once its metrics show a
// llama.cpp engine whose /slots was read; other engines have none.
func (r *replica) observeSlots(l scrape.Load) {
	if l.Engine != scrape.EngineLlamaCpp || l.Slots <= 0 {
		return
	}
	c := r.llama.Load()
	if c == nil {
		c = &slotCache{}
		if !r.llama.CompareAndSwap(nil, c) {
			c = r.llama.Load()
		}
	}
	c.resize(l.Slots)
}

// matchSlots replaces, for every llama.cpp replica, the residency match
// (in blocks of unit tokens) by what its slots would reuse.
func (f *Fleet) matchSlots(chains []residency.Chain, unit int, match []int) {
	if unit <= 0 {
		return
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	for i, r := range f.reps {
		c := r.llama.Load()
		if c == nil || i >= len(match) {
			continue
		}
		ch, ok := f.tr.ChainFor(chains, i)
		if !ok {
			continue
		}
		match[i] = c.predict(ch.Hashes) * ch.Tokens / unit
	}
}

// takeSlot commits a request's prompt to rep's slots, if it follows them;
// the claim is nil otherwise.
func (f *Fleet) takeSlot(rep *replica, chains []residency.Chain, output int) *slotClaim {
	c := rep.llama.Load()
	if c == nil {
		return nil
	}
	ch, ok := f.tr.ChainFor(chains, rep.index)
	if !ok || ch.Tokens <= 0 {
		return nil
	}
	return c.take(ch.Hashes, (output+ch.Tokens-1)/ch.Tokens)
}

// releaseSlot ends a ticket's claim on its replica's slot.
func (t *Ticket) releaseSlot() {
	if t.ext != nil && t.ext.slot != nil {
		if c := t.r.llama.Load(); c != nil {
			c.release(t.ext.slot)
		}
	}
}

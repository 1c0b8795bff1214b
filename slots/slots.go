// Package slots models the prompt cache of llama.cpp's llama-server, which
// is not a block cache as vLLM's. Each of its slots (the sequences it runs
// at once) keeps the tokens of its last request; a new request takes the
// idle slot whose tokens share the longest common prefix with its prompt,
// if that prefix is more than --slot-prompt-similarity (0.1) of the
// prompt, else the least recently used idle slot, and reuses the common
// prefix. A host-memory prompt cache (--cache-ram) keeps whole prompts:
// the prompts of the idle slots, saved when a request starts
// (--cache-idle-slots), and a slot's prompt when a request takes it by LRU
// or keeps less than half of it; such a slot first loads from that cache
// the saved prompt that shares more with the request than its own (one
// that keeps at least a quarter of it). A request that finds no idle slot
// waits (requests_deferred) and takes the first slot freed.
// (llama.cpp v0.4.0: tools/server/server-context.cpp, get_available_slot;
// server-task.cpp, server_prompt_cache.)
//
// Cache is that model over block-hash chains: the engine model runs it as
// the engine (package engine, a llama.cpp preset), and the router runs it
// per llama.cpp replica as its belief of what the engine holds (package
// fleet), so that both sides decide reuse by the same rules. A slot's
// content is a prompt's chain plus blocks that match nothing (the tokens
// generated after it, a partial last block).
package slots

import (
	"slices"

	"github.com/kvrouter/kvrouter/prefix"
)

// DefaultSimilarity is llama-server's --slot-prompt-similarity default.
const DefaultSimilarity = 0.1

// Cache is one llama.cpp engine's slots and host prompt cache. The zero
// value has no slot (Resize adds them) and an unbounded host cache. It is
// not safe for concurrent use.
type Cache struct {
	// Similarity is the share of a prompt a slot's prefix must exceed for
	// the slot to be picked by it; zero means DefaultSimilarity.
	Similarity float64
	// LimitBlocks bounds the host cache's content, in blocks (llama.cpp
	// bounds it by --cache-ram bytes), dropping the oldest prompts first;
	// zero means no bound.
	LimitBlocks int
	// MaxPrompts bounds the host cache's prompts; zero means no bound.
	MaxPrompts int

	slots []slot
	// saved is the host prompt cache, oldest first; savedBlocks its
	// content.
	saved       []content
	savedBlocks int
	// clock orders slot use (LRU).
	clock uint64
}

// content is a slot's or a saved prompt's tokens: chain, then extra
// blocks that match nothing.
type content struct {
	chain []prefix.Hash
	extra int
}

// blocks is the content's length in blocks.
func (c *content) blocks() int { return len(c.chain) + c.extra }

// slot is one slot: its content, whether a request runs in it, and when
// it was last taken.
type slot struct {
	content
	busy bool
	used uint64
}

// LCP is the common prefix of two chains, in blocks (chained hashes: the
// first difference ends it).
func LCP(a, b []prefix.Hash) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// Len is the slot count.
func (c *Cache) Len() int { return len(c.slots) }

// Resize sets the slot count, keeping what the first slots hold.
func (c *Cache) Resize(n int) {
	for len(c.slots) < n {
		c.slots = append(c.slots, slot{})
	}
	if len(c.slots) > n {
		c.slots = c.slots[:n]
	}
}

// Idle reports whether a slot is idle.
func (c *Cache) Idle() bool {
	for i := range c.slots {
		if !c.slots[i].busy {
			return true
		}
	}
	return false
}

// similarity is Similarity or its default.
func (c *Cache) similarity() float64 {
	if c.Similarity > 0 {
		return c.Similarity
	}
	return DefaultSimilarity
}

// pick is the slot llama.cpp gives a prompt of chain now, and whether it
// first saves the slot's content and loads a better prompt from the host
// cache; -1 when no slot is idle.
func (c *Cache) pick(chain []prefix.Hash) (i int, update bool) {
	best, bestSim := -1, 0.0
	for k := range c.slots {
		s := &c.slots[k]
		if s.busy || s.blocks() == 0 || len(chain) == 0 {
			continue
		}
		sim := float64(LCP(s.chain, chain)) / float64(len(chain))
		if sim > bestSim && sim > c.similarity() {
			best, bestSim = k, sim
		}
	}
	if best >= 0 {
		keep := bestSim * float64(len(chain)) / float64(c.slots[best].blocks())
		return best, keep < 0.5
	}
	for k := range c.slots {
		if s := &c.slots[k]; !s.busy && (best < 0 || s.used <= c.slots[best].used) {
			best = k
		}
	}
	return best, best >= 0
}

// loadable is the saved prompt a slot of content s would load for chain,
// -1 for none (server_prompt_cache::load).
func (c *Cache) loadable(s *content, chain []prefix.Hash) int {
	if len(chain) == 0 {
		return -1
	}
	l := LCP(s.chain, chain)
	keepBest, simBest := -1.0, float64(l)/float64(len(chain))
	if s.blocks() > 0 {
		keepBest = float64(l) / float64(s.blocks())
	}
	best := -1
	for i := range c.saved {
		p := &c.saved[i]
		if p.blocks() == 0 {
			continue
		}
		l := LCP(p.chain, chain)
		keep, sim := float64(l)/float64(p.blocks()), float64(l)/float64(len(chain))
		if keep < 0.25 {
			continue
		}
		if keepBest < keep && simBest < sim {
			keepBest, simBest, best = keep, sim, i
		}
	}
	return best
}

// Predict is the blocks of chain llama.cpp would reuse were the prompt
// sent now: from the slot it would take, or the saved prompt that slot
// would load; with every slot busy, from the best any slot or saved
// prompt holds (the request waits for a slot).
func (c *Cache) Predict(chain []prefix.Hash) int {
	i, update := c.pick(chain)
	if i < 0 {
		best := 0
		for k := range c.slots {
			best = max(best, LCP(c.slots[k].chain, chain))
		}
		for k := range c.saved {
			best = max(best, LCP(c.saved[k].chain, chain))
		}
		return best
	}
	s := &c.slots[i].content
	if update {
		if j := c.loadable(s, chain); j >= 0 {
			return LCP(c.saved[j].chain, chain)
		}
	}
	return LCP(s.chain, chain)
}

// Start puts a prompt of chain, followed by extra blocks that match
// nothing, in the slot llama.cpp gives it, saving and loading prompts as
// it does, then saves every other idle slot's content to the host cache.
// It returns the slot and the blocks of chain reused; slot -1 when no
// slot is idle (nothing changes: the request waits). The cache keeps
// chain: do not modify it.
func (c *Cache) Start(chain []prefix.Hash, extra int) (i, reused int) {
	i, update := c.pick(chain)
	if i < 0 {
		return -1, 0
	}
	s := &c.slots[i]
	if update {
		c.save(s.content)
		if j := c.loadable(&s.content, chain); j >= 0 {
			s.content = c.saved[j]
			c.drop(j)
		}
	}
	reused = LCP(s.chain, chain)
	c.clock++
	*s = slot{content: content{chain: chain, extra: extra}, busy: true, used: c.clock}
	for k := range c.slots {
		if o := &c.slots[k]; !o.busy {
			c.save(o.content)
		}
	}
	return i, reused
}

// Release ends the request in slot i: the slot is idle again, keeping its
// content. An index out of range is ignored.
func (c *Cache) Release(i int) {
	if i >= 0 && i < len(c.slots) {
		c.slots[i].busy = false
	}
}

// Saved is the host cache's prompts and their blocks.
func (c *Cache) Saved() (prompts, blocks int) { return len(c.saved), c.savedBlocks }

// save adds a content to the host cache unless a saved prompt holds it
// whole, dropping those it holds whole and then the oldest while over the
// bounds (server_prompt_cache::alloc and update).
func (c *Cache) save(p content) {
	if len(p.chain) == 0 {
		return
	}
	if c.LimitBlocks > 0 && p.blocks() > c.LimitBlocks {
		return // larger than the whole cache: skipped
	}
	for k := range c.saved {
		if LCP(c.saved[k].chain, p.chain) == len(p.chain) {
			return
		}
	}
	for k := len(c.saved) - 1; k >= 0; k-- {
		if LCP(c.saved[k].chain, p.chain) == len(c.saved[k].chain) {
			c.drop(k)
		}
	}
	for len(c.saved) > 0 && (c.LimitBlocks > 0 && c.savedBlocks+p.blocks() > c.LimitBlocks ||
		c.MaxPrompts > 0 && len(c.saved) >= c.MaxPrompts) {
		c.drop(0)
	}
	c.saved = append(c.saved, p)
	c.savedBlocks += p.blocks()
}

// drop removes saved prompt k.
func (c *Cache) drop(k int) {
	c.savedBlocks -= c.saved[k].blocks()
	c.saved = slices.Delete(c.saved, k, k+1)
}

package fleet

import (
	"slices"
	"sync"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/scrape"
	"github.com/kvrouter/kvrouter/slots"
)

// slotCache follows a llama.cpp replica's slots and host prompt cache
// (package slots: the engine model runs the same rules) over the prompts'
// block-hash chains, so that the prefix a request is predicted to reuse
// there is what the engine reuses, not what the residency index believes
// resident anywhere in it. It knows prompts, not the tokens the engine
// generated after them: a slot's tokens are its prompt's blocks, plus its
// expected output as blocks that match nothing.
type slotCache struct {
	// mu guards everything below.
	mu sync.Mutex
	c  slots.Cache
	// deferred are the prompts committed while every slot was busy, in
	// order: each takes the next slot freed.
	deferred []*slotClaim
}

// newSlotCache is a cache whose host part keeps at most maxSaved prompts.
func newSlotCache() *slotCache {
	return &slotCache{c: slots.Cache{MaxPrompts: maxSaved}}
}

// slotClaim is a request's hold on a slot, released when it ends.
type slotClaim struct {
	chain []prefix.Hash
	extra int
	slot  int // -1 while deferred
	done  bool
}

// resize sets the slot count (llama.cpp's /slots), keeping what the first
// slots hold.
func (c *slotCache) resize(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.c.Resize(n)
}

// predict is the blocks of chain llama.cpp would reuse were the prompt
// sent now (slots.Cache.Predict).
func (c *slotCache) predict(chain []prefix.Hash) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.c.Predict(chain)
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

// startLocked puts cl in the slot llama.cpp gives it; false when no slot
// is idle. mu is held.
func (c *slotCache) startLocked(cl *slotClaim) bool {
	i, _ := c.c.Start(cl.chain, cl.extra)
	cl.slot = i
	return i >= 0
}

// maxSaved bounds the host cache's prompts kept (llama.cpp bounds it by
// --cache-ram, 8 GiB by default: more prompts than a router routes to one
// replica between two of its evictions, for small models).
const maxSaved = 256

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
	c.c.Release(cl.slot)
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
		c = newSlotCache()
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

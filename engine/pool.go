package engine

import "github.com/kvrouter/kvrouter/prefix"

// block is one KV block of the paged cache.
type block struct {
	// hash is the block's chained hash while cached is true.
	hash prefix.Hash
	// prev and next link the block into the free queue; -1 when not in it.
	prev, next int32
	// ref counts the running requests whose block table holds the block.
	ref int32
	// cached is true while the block is computed, full and reusable: its
	// hash is in pool.table.
	cached bool
}

// pool is the paged KV cache with automatic prefix caching, after vLLM v1's
// BlockPool (vllm/v1/core/block_pool.py): blocks with reference counts, a
// hash table of computed full blocks, and a free queue in LRU order
// (vllm/v1/core/kv_cache_utils.py, FreeKVCacheBlockQueue) whose head is
// evicted first. A freed block keeps its hash until it is taken for new
// data, so it can still be hit while it waits in the queue.
//
// The queue is an index-linked list threaded through blocks, with a
// sentinel at index len(blocks)-1: no allocation on any per-token path.
type pool struct {
	blocks []block
	// sentinel is the free queue's head/tail sentinel index.
	sentinel int32
	// nfree is the free queue's length: free plus evictable cached blocks.
	nfree int
	// table maps a cached block's hash to its index.
	table table
}

// newPool returns a pool of n free blocks, in index order.
func newPool(n int) *pool {
	p := &pool{
		blocks:   make([]block, n+1),
		sentinel: int32(n),
		table:    newTable(n),
	}
	s := p.sentinel
	p.blocks[s].prev, p.blocks[s].next = s, s
	for i := range int32(n) {
		p.pushBack(i)
	}
	return p
}

// pushBack appends block i to the tail of the free queue.
func (p *pool) pushBack(i int32) {
	s := p.sentinel
	last := p.blocks[s].prev
	p.blocks[i].prev, p.blocks[i].next = last, s
	p.blocks[last].next = i
	p.blocks[s].prev = i
	p.nfree++
}

// unlink removes block i from the free queue.
func (p *pool) unlink(i int32) {
	b := &p.blocks[i]
	p.blocks[b.prev].next = b.next
	p.blocks[b.next].prev = b.prev
	b.prev, b.next = -1, -1
	p.nfree--
}

// lookup returns the cached block holding hash h.
func (p *pool) lookup(h prefix.Hash) (int32, bool) {
	return p.table.get(h)
}

// touch takes a reference on cached block i, taking it off the free queue
// if nobody held it.
func (p *pool) touch(i int32) {
	if p.blocks[i].ref == 0 {
		p.unlink(i)
	}
	p.blocks[i].ref++
}

// alloc takes the least recently freed block for new data. If it was
// cached, its hash is dropped and appended to evicted. The caller has
// checked nfree > 0.
func (p *pool) alloc(evicted []prefix.Hash) (int32, []prefix.Hash) {
	i := p.blocks[p.sentinel].next
	p.unlink(i)
	b := &p.blocks[i]
	if b.cached {
		p.table.del(b.hash)
		evicted = append(evicted, b.hash)
		b.cached = false
	}
	b.ref = 1
	return i, evicted
}

// release drops a reference on block i; at zero the block joins the tail
// of the free queue, keeping its hash.
func (p *pool) release(i int32) {
	b := &p.blocks[i]
	b.ref--
	if b.ref == 0 {
		p.pushBack(i)
	}
}

// store marks block i computed with hash h and makes it reusable. It
// reports false, leaving the block uncached, when another block already
// holds h (two requests computed the same prefix at once): one owner per
// hash keeps BlockStored and BlockRemoved exactly paired.
func (p *pool) store(i int32, h prefix.Hash) bool {
	if !p.table.add(h, i) {
		return false
	}
	p.blocks[i].hash = h
	p.blocks[i].cached = true
	return true
}

// clear uncaches every block, as vLLM's reset_prefix_cache.
func (p *pool) clear() {
	for i := range p.blocks {
		p.blocks[i].cached = false
	}
	p.table.clear()
}

// used is the number of blocks held by requests.
func (p *pool) used() int { return len(p.blocks) - 1 - p.nfree }

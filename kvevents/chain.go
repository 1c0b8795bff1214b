package kvevents

import (
	"time"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
)

// gpuBit is the media bit of GPU, the only medium whose blocks go to the
// index. Blocks on other media (CPU, disk, ...) are known to the chain, so
// that blocks chained onto them and their removals are understood, and
// counted (chain.offloaded), but not indexed: a router that prices them
// lower needs a per-entry weight residency does not have yet.
const gpuBit = uint8(1) << GPU

// chain is one replica's view of its engine's cache: engine block hash →
// router key and the media holding it, plus reference counts of the router
// keys held on GPU (two engine blocks can share a key: blocks that differ
// only in extra keys such as multimodal hashes, which the router cannot
// see). It is owned by the replica's goroutine; its memory is bounded by
// the engine's cached blocks, entries leaving on BlockRemoved and resets.
type chain struct {
	replica int
	model   string
	idx     *residency.Index
	now     func() time.Duration

	roots     map[string]prefix.Hash // LoRA name → chain root
	blocks    map[uint64]block       // engine key (ekey) → block
	refs      map[prefix.Hash]int32  // router key → engine blocks holding it on GPU
	offloaded int                    // engine blocks held on non-GPU media only
	blockSize int                    // tokens per block of the BlockStored events, 0 before one
	add, del  []prefix.Hash          // scratch: keys to store, to remove
}

// block is one engine block the router can key.
type block struct {
	key   prefix.Hash
	media uint8 // bit 1<<Medium per medium holding it
}

// onGPU reports whether the block is in GPU memory, and so in the index.
func (b block) onGPU() bool { return b.media&gpuBit != 0 }

// offGPU reports whether the block is held only on non-GPU media.
func (b block) offGPU() bool { return b.media != 0 && b.media&gpuBit == 0 }

// applied counts what applying a batch did.
type applied struct {
	events, stored, removed, orphans, resets int
	unknown                                  int // removed blocks the chain did not hold (on that medium)
}

func newChain(replica int, model string, idx *residency.Index, now func() time.Duration) *chain {
	c := &chain{replica: replica, model: model, idx: idx, now: now}
	c.reset()
	return c
}

// reset forgets every block, releasing the maps' memory.
func (c *chain) reset() {
	c.roots = map[string]prefix.Hash{}
	c.blocks = map[uint64]block{}
	c.refs = map[prefix.Hash]int32{}
	c.offloaded = 0
}

// clear drops the replica's entries from the index and forgets its blocks
// (AllBlocksCleared, an engine restart, a gap replay cannot fill).
func (c *chain) clear() {
	c.idx.Clear(c.replica)
	c.reset()
}

// setModel sets the model the chain roots fold in (from the topic when
// the configuration names none); blocks keyed under another model are
// dropped.
func (c *chain) setModel(m string) {
	if m != c.model {
		c.model = m
		c.clear()
	}
}

// Len is the number of engine blocks the chain knows, on any medium.
func (c *chain) Len() int { return len(c.blocks) }

// apply applies a decoded batch to the index, event by event.
func (c *chain) apply(b *Batch) applied {
	var n applied
	for i := range b.Events {
		e := &b.Events[i]
		n.events++
		switch e.Kind {
		case Stored:
			c.stored(e, &n)
		case Removed:
			c.removed(e, &n)
		case Cleared:
			c.clear()
			n.resets++
		}
		c.flush()
	}
	return n
}

// ekey is the chain's key of an engine hash: hybrid models publish the same
// hash once per KV-cache group.
func ekey(h uint64, group int) uint64 {
	return h ^ uint64(group)*0x9E3779B97F4A7C15
}

func (c *chain) root(lora string) prefix.Hash {
	if r, ok := c.roots[lora]; ok {
		return r
	}
	if len(c.roots) >= 1024 {
		clear(c.roots)
	}
	r := prefix.Root(c.model, lora)
	c.roots[lora] = r
	return r
}

// stored keys each block by the router's chained hash of its tokens. A
// block whose parent the chain does not know (the subscriber joined
// mid-stream, or lost events it could not replay) cannot be keyed: its
// event is counted as orphans and skipped.
func (c *chain) stored(e *Event, n *applied) {
	if len(e.Hashes) == 0 {
		return
	}
	c.noteBlockSize(e)
	parent := c.root(e.LoRA)
	if e.HasParent {
		p, ok := c.blocks[ekey(e.Parent, e.Group)]
		if !ok {
			n.orphans += len(e.Hashes)
			return
		}
		parent = p.key
	}
	bit, bs := uint8(1)<<e.Medium, e.BlockSize
	for i, h := range e.Hashes {
		key := prefix.ChainTokens(parent, e.Tokens[i*bs:(i+1)*bs])
		parent = key
		k := ekey(h, e.Group)
		old, ok := c.blocks[k]
		b := block{key: key, media: bit}
		if ok && old.key == key { // else the engine reused a hash for new content
			b.media |= old.media
		}
		c.set(k, old, b)
		n.stored++
	}
}

// noteBlockSize keeps the engine's tokens per block from a BlockStored:
// KV-cache group 0's (the only group of most models; a hybrid model's
// groups may differ), another group's until group 0 stored a block. It
// survives resets: a clear does not change the engine's block size, and a
// restarted engine's next BlockStored updates it.
func (c *chain) noteBlockSize(e *Event) {
	if e.BlockSize > 0 && (e.Group == 0 || c.blockSize == 0) {
		c.blockSize = e.BlockSize
	}
}

func (c *chain) removed(e *Event, n *applied) {
	bit := uint8(1) << e.Medium
	for _, h := range e.Hashes {
		k := ekey(h, e.Group)
		old, ok := c.blocks[k]
		if !ok || old.media&bit == 0 {
			n.unknown++
			continue
		}
		b := old
		b.media &^= bit
		c.set(k, old, b)
		n.removed++
	}
}

// set replaces engine block k, old (zero if new), with b (forgotten if it
// is on no medium), keeping the GPU key references and the off-GPU count
// in step.
func (c *chain) set(k uint64, old, b block) {
	moved := old.key != b.key
	if old.onGPU() && (moved || !b.onGPU()) {
		c.unref(old.key)
	}
	if b.onGPU() && (moved || !old.onGPU()) {
		c.ref(b.key)
	}
	c.offloaded += b2i(b.offGPU()) - b2i(old.offGPU())
	if b.media == 0 {
		delete(c.blocks, k)
	} else {
		c.blocks[k] = b
	}
}

func (c *chain) ref(key prefix.Hash) {
	n := c.refs[key] + 1
	c.refs[key] = n
	if n == 1 {
		c.add = append(c.add, key)
	}
}

func (c *chain) unref(key prefix.Hash) {
	n := c.refs[key] - 1
	if n > 0 {
		c.refs[key] = n
		return
	}
	delete(c.refs, key)
	c.del = append(c.del, key)
}

// flush writes the pending stores and removals to the index, removals
// first (an event never both stores and removes the same key).
func (c *chain) flush() {
	if len(c.del) > 0 {
		c.idx.Remove(c.replica, c.del)
	}
	if len(c.add) > 0 {
		c.idx.Store(c.replica, c.add, c.now())
	}
	c.add, c.del = c.add[:0], c.del[:0]
}

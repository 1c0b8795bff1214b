package kvevents

import (
	"time"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
)

// gpuBit is the media bit of GPU, whose blocks go to the index. Blocks on
// other media (CPU, disk, ...) go to the offload index when there is one
// (a block on the GPU and the CPU tier, as write-through offloading keeps
// it, is in both), and are counted when held off the GPU only
// (chain.offloaded).
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
	off     *residency.Index // blocks on other media; nil: not indexed
	now     func() time.Duration

	roots      map[string]prefix.Hash // LoRA name → chain root
	blocks     map[uint64]block       // engine key (ekey) → block
	refs       map[prefix.Hash]int32  // router key → engine blocks holding it on GPU
	orefs      map[prefix.Hash]int32  // router key → engine blocks holding it on other media (when off is set)
	offloaded  int                    // engine blocks held on non-GPU media only
	blockSize  int                    // tokens per block of the BlockStored events, 0 before one
	add, del   []prefix.Hash          // scratch: keys to store, to remove
	oadd, odel []prefix.Hash          // the same for off
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

// onOther reports whether the block is held on a non-GPU medium.
func (b block) onOther() bool { return b.media&^gpuBit != 0 }

// applied counts what applying a batch did.
type applied struct {
	events, stored, removed, orphans, resets int
	unknown                                  int // removed blocks the chain did not hold (on that medium)
}

func newChain(replica int, model string, idx, off *residency.Index, now func() time.Duration) *chain {
	c := &chain{replica: replica, model: model, idx: idx, off: off, now: now}
	c.reset()
	return c
}

// reset forgets every block, releasing the maps' memory.
func (c *chain) reset() {
	c.roots = map[string]prefix.Hash{}
	c.blocks = map[uint64]block{}
	c.refs = map[prefix.Hash]int32{}
	c.orefs = map[prefix.Hash]int32{}
	c.offloaded = 0
}

// clear drops the replica's entries from the index and forgets its blocks
// (AllBlocksCleared, an engine restart, a gap replay cannot fill).
func (c *chain) clear() {
	c.idx.Clear(c.replica)
	if c.off != nil {
		c.off.Clear(c.replica)
	}
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
	if c.off != nil {
		if old.onOther() && (moved || !b.onOther()) {
			c.oadd, c.odel = unref(c.orefs, old.key, c.oadd, c.odel)
		}
		if b.onOther() && (moved || !old.onOther()) {
			c.oadd, c.odel = ref(c.orefs, b.key, c.oadd, c.odel)
		}
	}
	c.offloaded += b2i(b.offGPU()) - b2i(old.offGPU())
	if b.media == 0 {
		delete(c.blocks, k)
	} else {
		c.blocks[k] = b
	}
}

func (c *chain) ref(key prefix.Hash)   { c.add, c.del = ref(c.refs, key, c.add, c.del) }
func (c *chain) unref(key prefix.Hash) { c.add, c.del = unref(c.refs, key, c.add, c.del) }

// ref counts one more engine block holding router key in refs, queueing
// the key for the index (add) when it is the first.
func ref(refs map[prefix.Hash]int32, key prefix.Hash, add, del []prefix.Hash) ([]prefix.Hash, []prefix.Hash) {
	n := refs[key] + 1
	refs[key] = n
	if n == 1 {
		add = append(add, key)
	}
	return add, del
}

// unref counts one engine block fewer, queueing the key's removal (del)
// when it was the last.
func unref(refs map[prefix.Hash]int32, key prefix.Hash, add, del []prefix.Hash) ([]prefix.Hash, []prefix.Hash) {
	n := refs[key] - 1
	if n > 0 {
		refs[key] = n
		return add, del
	}
	delete(refs, key)
	return add, append(del, key)
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
	if c.off == nil {
		return
	}
	if len(c.odel) > 0 {
		c.off.Remove(c.replica, c.odel)
	}
	if len(c.oadd) > 0 {
		c.off.Store(c.replica, c.oadd, c.now())
	}
	c.oadd, c.odel = c.oadd[:0], c.odel[:0]
}

package kvevents

import (
	"time"

	"kvrouter/prefix"
	"kvrouter/residency"
)

// Tiers of the index. GPU blocks go to the main index; blocks on any other
// medium (CPU, disk, ...) to the offload index if there is one, and are only
// counted otherwise. residency has no per-entry weight, so a router that
// wants to price offloaded blocks matches a request against both indexes
// and weighs the offload matches lower.
const (
	tierMain = iota
	tierOffload
	numTiers
)

func tierOf(m Medium) int {
	if m == GPU {
		return tierMain
	}
	return tierOffload
}

// tierMask holds the medium bits of each tier.
var tierMask = [numTiers]uint8{tierMain: 1 << GPU, tierOffload: 1<<CPU | 1<<Disk | 1<<OtherMedium}

// chain is one replica's view of its engine's cache: engine block hash →
// router key and the media holding it, plus per-tier reference counts of
// router keys (two engine blocks can share a key: blocks that differ only
// in extra keys such as multimodal hashes, which the router cannot see).
// It is owned by the replica's goroutine; its memory is bounded by the
// engine's cached blocks, entries leaving on BlockRemoved and resets.
type chain struct {
	replica int
	model   string
	idx     [numTiers]*residency.Index // idx[tierOffload] may be nil
	now     func() time.Duration

	roots  map[string]prefix.Hash // LoRA name → chain root
	blocks map[uint64]block       // engine key (ekey) → block
	refs   [numTiers]map[prefix.Hash]int32
	add    [numTiers][]prefix.Hash // scratch: keys to store
	del    [numTiers][]prefix.Hash // scratch: keys to remove
}

// block is one engine block the router can key.
type block struct {
	key   prefix.Hash
	media uint8 // bit 1<<Medium per medium holding it
}

// applied counts what applying a batch did.
type applied struct {
	events, stored, removed, orphans, resets int
}

func newChain(replica int, model string, main, offload *residency.Index, now func() time.Duration) *chain {
	c := &chain{replica: replica, model: model, idx: [numTiers]*residency.Index{main, offload}, now: now}
	c.reset()
	return c
}

// reset forgets every block, releasing the maps' memory.
func (c *chain) reset() {
	c.roots = map[string]prefix.Hash{}
	c.blocks = map[uint64]block{}
	for t := range c.refs {
		c.refs[t] = map[prefix.Hash]int32{}
	}
}

// clear drops the replica's entries from the index and forgets its blocks
// (AllBlocksCleared, an engine restart, a gap replay cannot fill).
func (c *chain) clear() {
	for _, x := range c.idx {
		if x != nil {
			x.Clear(c.replica)
		}
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

// Len is the number of engine blocks the chain knows.
func (c *chain) Len() int { return len(c.blocks) }

// offloaded is the number of distinct keys held on non-GPU media only or
// too.
func (c *chain) offloaded() int { return len(c.refs[tierOffload]) }

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
	parent := c.root(e.LoRA)
	if e.HasParent {
		p, ok := c.blocks[ekey(e.Parent, e.Group)]
		if !ok {
			n.orphans += len(e.Hashes)
			return
		}
		parent = p.key
	}
	t, bit := tierOf(e.Medium), uint8(1)<<e.Medium
	bs := e.BlockSize
	for i, h := range e.Hashes {
		key := prefix.ChainTokens(parent, e.Tokens[i*bs:(i+1)*bs])
		parent = key
		k := ekey(h, e.Group)
		b, ok := c.blocks[k]
		if ok && b.key != key { // the engine reused a hash for new content
			c.drop(b, b.media)
			b = block{}
		}
		b.key = key
		if b.media&bit == 0 {
			if b.media&tierMask[t] == 0 {
				c.ref(t, key)
			}
			b.media |= bit
		}
		c.blocks[k] = b
		n.stored++
	}
}

func (c *chain) removed(e *Event, n *applied) {
	bit := uint8(1) << e.Medium
	for _, h := range e.Hashes {
		k := ekey(h, e.Group)
		b, ok := c.blocks[k]
		if !ok || b.media&bit == 0 {
			continue
		}
		c.drop(b, bit)
		b.media &^= bit
		if b.media == 0 {
			delete(c.blocks, k)
		} else {
			c.blocks[k] = b
		}
		n.removed++
	}
}

// drop releases the tiers b loses when the media bits leave it.
func (c *chain) drop(b block, bits uint8) {
	left := b.media &^ bits
	for t := range numTiers {
		if b.media&tierMask[t] != 0 && left&tierMask[t] == 0 {
			c.unref(t, b.key)
		}
	}
}

func (c *chain) ref(t int, key prefix.Hash) {
	n := c.refs[t][key] + 1
	c.refs[t][key] = n
	if n == 1 {
		c.add[t] = append(c.add[t], key)
	}
}

func (c *chain) unref(t int, key prefix.Hash) {
	n := c.refs[t][key] - 1
	if n > 0 {
		c.refs[t][key] = n
		return
	}
	delete(c.refs[t], key)
	c.del[t] = append(c.del[t], key)
}

// flush writes the pending stores and removals to the indexes, removals
// first (an event never both stores and removes the same key).
func (c *chain) flush() {
	for t, x := range c.idx {
		if x != nil && len(c.del[t]) > 0 {
			x.Remove(c.replica, c.del[t])
		}
		if x != nil && len(c.add[t]) > 0 {
			x.Store(c.replica, c.add[t], c.now())
		}
		c.add[t], c.del[t] = c.add[t][:0], c.del[t][:0]
	}
}

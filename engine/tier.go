package engine

import (
	"time"

	"github.com/kvrouter/kvrouter/prefix"
)

// Medium is the storage tier of a cached block, as vLLM's KV events name
// it (`medium`).
type Medium uint8

// Media.
const (
	// GPU is device memory: the paged cache the engine computes in.
	GPU Medium = iota
	// CPU is host memory: the offload tier (Config.CPUBlocks).
	CPU
)

// String is the medium's name on the wire: "GPU" or "CPU".
func (m Medium) String() string {
	if m == CPU {
		return "CPU"
	}
	return "GPU"
}

// DefaultPCIeGBps is the host-to-device bandwidth assumed when
// Config.PCIeGBps is zero: PCIe 5.0 ×16 as a transfer achieves it (64 GB/s
// on paper).
const DefaultPCIeGBps = 50

// tier is the host-memory offload tier, after vLLM's CPU offloading
// connector and LMCache's local CPU backend: every block the GPU cache
// stores is copied to it as it is computed (write-through), it keeps the
// most recently used CPUBlocks blocks (LRU), and a prompt block found
// there but no longer on the GPU is loaded back over PCIe instead of
// recomputed. Only hashes are kept: like the GPU pool, the model tracks
// which blocks exist, not their contents.
//
// The LRU list is index-linked through nodes with a sentinel at
// len(nodes)-1, as the pool's free queue: no allocation per block.
type tier struct {
	nodes    []tierNode
	sentinel int32
	used     int32 // nodes in use; nodes[used:sentinel] were never used
	table    table // hash → node index
	// pcie is the host-to-device link the tier's blocks load over.
	pcie link
}

// link is one direction of a data link that moves KV blocks: transfers
// are serialised on it, which shares its bandwidth between concurrent
// ones.
type link struct {
	// free is when the link is next idle.
	free time.Duration
	// perBlock is the time one block takes over it.
	perBlock time.Duration
}

// reserve queues n blocks on the link at now and returns when the last
// has crossed.
func (l *link) reserve(now time.Duration, n int) time.Duration {
	l.free = max(l.free, now) + time.Duration(n)*l.perBlock
	return l.free
}

type tierNode struct {
	hash       prefix.Hash
	prev, next int32
}

// newTier returns an empty tier of n blocks whose loads take perBlock each.
func newTier(n int, perBlock time.Duration) *tier {
	t := &tier{nodes: make([]tierNode, n+1), sentinel: int32(n), table: newTable(n), pcie: link{perBlock: perBlock}}
	s := t.sentinel
	t.nodes[s].prev, t.nodes[s].next = s, s
	return t
}

// has reports whether block h is in the tier.
func (t *tier) has(h prefix.Hash) bool {
	_, ok := t.table.get(h)
	return ok
}

// touch makes block h, if present, the most recently used.
func (t *tier) touch(h prefix.Hash) {
	if i, ok := t.table.get(h); ok {
		t.unlink(i)
		t.pushBack(i)
	}
}

// put stores block h, or touches it if present. It reports whether h is
// new, and the block evicted to make room for it (evicted false: none).
func (t *tier) put(h prefix.Hash) (added bool, victim prefix.Hash, evicted bool) {
	if i, ok := t.table.get(h); ok {
		t.unlink(i)
		t.pushBack(i)
		return false, 0, false
	}
	i := t.used
	if i < t.sentinel {
		t.used++
	} else {
		i = t.nodes[t.sentinel].next
		t.unlink(i)
		victim, evicted = t.nodes[i].hash, true
		t.table.del(victim)
	}
	t.nodes[i].hash = h
	t.table.add(h, i)
	t.pushBack(i)
	return true, victim, evicted
}

// clear drops every block.
func (t *tier) clear() {
	s := t.sentinel
	t.nodes[s].prev, t.nodes[s].next = s, s
	t.used = 0
	t.table.clear()
}

func (t *tier) pushBack(i int32) {
	s := t.sentinel
	last := t.nodes[s].prev
	t.nodes[i].prev, t.nodes[i].next = last, s
	t.nodes[last].next = i
	t.nodes[s].prev = i
}

func (t *tier) unlink(i int32) {
	n := &t.nodes[i]
	t.nodes[n.prev].next = n.next
	t.nodes[n.next].prev = n.prev
}

// len is the blocks in the tier.
func (t *tier) len() int { return t.table.n }

// Package residency is the cache-residency index: which replica holds which
// prefix block, and since when.
//
// One Index serves the whole fleet. It is fed by routing decisions
// (approximate mode: Touch, each replica's cache modelled as an LRU of its
// capacity in blocks) or by the engines' KV events (precise mode: Store,
// Remove, Clear), and answers Match: for every replica, how many leading
// blocks of a request it holds, in one walk over the request's hashes.
//
// Layout, for bounded and compact memory (29 to 35 bytes per (block,
// replica) as the table fills, 31 at 10 million: BenchmarkIndexMemory):
// one 24-byte entry per (block, replica) in a chunked slab, holding the
// block's hash, its last touch and its replica's LRU links (int32 ids,
// with the replica's id in their spare bits); one 4-byte slot per
// distinct block hash in an open-addressing table. A block held by one
// replica (most of them) is its slot's reference to its entry. A block
// held by a few (2 to 15) is a group: its hash and a run of their entry
// and replica indices in a shared arena (8 bytes a holder, runs of 2, 4,
// 8 or 16 slots), so that Match reads them without chasing a chain or
// loading the entries; by many (hot: 16 or more, such as a shared system
// prompt) it keeps a bitset of its holders and their last-touched times
// by rank, so Match crosses it with a few word operations however many
// replicas hold it.
package residency

import (
	"fmt"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
)

// Limits of an Index.
const (
	// MaxReplicasLimit is the most replicas an Index tracks.
	MaxReplicasLimit = 4096
	// hotAt is the holder count at which a block gets a bitset; coldAt the
	// count below which it loses it (hysteresis, so a block at the threshold
	// does not flip on every touch).
	hotAt  = 16
	coldAt = 8
)

// Config sizes an Index. The zero value is usable.
type Config struct {
	// MaxReplicas bounds replica ids: 0 <= r < MaxReplicas. Zero means 1024;
	// at most MaxReplicasLimit.
	MaxReplicas int
	// DefaultCapacity is a replica's capacity in blocks when AddReplica is
	// given none, or when Touch or Store name a replica not added; zero
	// means 65,536 blocks.
	DefaultCapacity int
	// TTL drops entries untouched for longer: Match ignores them and writes
	// (and Expire) delete them. Zero means entries never expire.
	TTL time.Duration
}

// Index maps block hashes to the replicas holding them. It is safe for
// concurrent use: mu guards everything below it; Match takes the read lock,
// writes the write lock.
type Index struct {
	cfg   Config
	words int // uint64 words of a replica bitset

	mu        sync.RWMutex
	nodes     table
	groups    []group   // blocks with several holders, by id (table references)
	freeGroup int32     // head of the free group list; -1 if none
	chunks    [][]entry // the entries (slab.go); freed entries go to freeEnt
	freeEnt   int32     // head of the free entry list, linked by next; -1 if none
	// held is, for every entry a request holds (touched heldStamp), how
	// many hold it: few entries, so not a field of every one.
	held map[int32]int32
	// maxEntries is MaxEntries (lowered by tests).
	maxEntries int
	holders    []holder // runs of the holders of nodes with 2 to hotAt-1 holders
	freeRun    [4]int32 // heads of the free runs by class (2, 4, 8, 16 slots), linked by their first slot; -1 if none
	hots       []hot
	freeHot    []int32
	replicas   []replica
	total      int
}

// node is one distinct block hash.
type node struct {
	// head is the holder's entry when count is 1, the offset of the
	// holders' run in Index.holders when count is 2 to hotAt-1, -1 if hot.
	head  int32
	count int32 // holders (cold); -(hot index + 1) when hot
}

// hot is the holder set of a block held by many replicas.
type hot struct {
	bits    []uint64        // holders
	touched []time.Duration // last touch, by rank of the replica in bits
	entries []int32         // entry index, by rank
	oldest  time.Duration   // a lower bound of min(touched)
}

// replica is one replica's LRU list.
type replica struct {
	head, tail int32
	n, cap     int
	live       bool
}

// New returns an empty index.
func New(cfg Config) *Index {
	if cfg.MaxReplicas <= 0 {
		cfg.MaxReplicas = 1024
	}
	cfg.MaxReplicas = min(cfg.MaxReplicas, MaxReplicasLimit)
	if cfg.DefaultCapacity <= 0 {
		cfg.DefaultCapacity = 1 << 16
	}
	x := &Index{
		cfg:        cfg,
		words:      (cfg.MaxReplicas + 63) / 64,
		nodes:      newTable(),
		freeGroup:  -1,
		freeEnt:    -1,
		held:       map[int32]int32{},
		maxEntries: MaxEntries,
		freeRun:    [4]int32{-1, -1, -1, -1},
		replicas:   make([]replica, cfg.MaxReplicas),
	}
	for i := range x.replicas {
		x.replicas[i] = replica{head: -1, tail: -1}
	}
	return x
}

// Config returns the index's configuration with defaults filled in.
func (x *Index) Config() Config { return x.cfg }

// AddReplica starts tracking replica r with a capacity in blocks (zero or
// less means Config.DefaultCapacity). Adding a known replica sets its
// capacity.
func (x *Index) AddReplica(r, capacityBlocks int) error {
	if r < 0 || r >= x.cfg.MaxReplicas {
		return fmt.Errorf("residency: replica %d out of range [0, %d)", r, x.cfg.MaxReplicas)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.replicas[r].live = true
	x.setCapacityLocked(r, capacityBlocks)
	return nil
}

// SetCapacity sets replica r's capacity in blocks (zero or less means
// Config.DefaultCapacity), evicting its least recently touched blocks beyond
// it. Unknown replicas are ignored.
func (x *Index) SetCapacity(r, blocks int) {
	if !x.valid(r) {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.replicas[r].live {
		x.setCapacityLocked(r, blocks)
	}
}

func (x *Index) setCapacityLocked(r, blocks int) {
	if blocks <= 0 {
		blocks = x.cfg.DefaultCapacity
	}
	rep := &x.replicas[r]
	rep.cap = blocks
	for rep.n > rep.cap {
		x.deleteLocked(rep.tail)
	}
}

// RemoveReplica drops replica r and all its entries.
func (x *Index) RemoveReplica(r int) {
	if !x.valid(r) {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.clearLocked(r)
	x.replicas[r] = replica{head: -1, tail: -1}
}

// Clear drops all of replica r's entries (an engine restart, or
// AllBlocksCleared), keeping the replica and its capacity.
func (x *Index) Clear(r int) {
	if !x.valid(r) {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.clearLocked(r)
}

func (x *Index) clearLocked(r int) {
	for x.replicas[r].head >= 0 {
		x.deleteLocked(x.replicas[r].head)
	}
}

func (x *Index) valid(r int) bool { return r >= 0 && r < x.cfg.MaxReplicas }

// Touch records that the request whose chain is hashes was routed to r
// (approximate mode): every block is inserted or refreshed at now, block 0
// becoming the most recent so that a chain is evicted from its tail, and r's
// least recently touched blocks beyond its capacity are evicted. An unknown
// r is added with the default capacity; an out-of-range r is ignored.
func (x *Index) Touch(r int, hashes []prefix.Hash, now time.Duration) {
	x.Store(r, hashes, now)
}

// Store records that replica r stored the blocks hashes (precise mode, from
// KV events), exactly as Touch does; capacity still bounds r's entries.
func (x *Index) Store(r int, hashes []prefix.Hash, now time.Duration) {
	x.store(r, hashes, now, false)
}

// store is Store, and Hold when hold.
func (x *Index) store(r int, hashes []prefix.Hash, now time.Duration, hold bool) {
	if !x.valid(r) || len(hashes) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	rep := &x.replicas[r]
	if !rep.live {
		rep.live = true
		rep.cap = x.cfg.DefaultCapacity
	}
	x.expireLocked(r, now)
	for i := len(hashes) - 1; i >= 0; i-- {
		e := x.upsertLocked(r, hashes[i], now)
		if hold && e >= 0 {
			x.held[e] = x.heldCount(e) + 1
			x.stampLocked(e, heldStamp)
		}
	}
}

// Remove drops replica r's entries for hashes (precise mode: BlockRemoved).
// Hashes r does not hold are ignored.
func (x *Index) Remove(r int, hashes []prefix.Hash) {
	if !x.valid(r) {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, h := range hashes {
		if e := x.findLocked(r, h); e >= 0 {
			x.deleteLocked(e)
		}
	}
}

// Expire drops, on every replica, the entries untouched for longer than
// Config.TTL at now. Writes expire their own replica, so calling Expire is
// only needed to reclaim memory of replicas that get no traffic.
func (x *Index) Expire(now time.Duration) {
	if x.cfg.TTL <= 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for r := range x.replicas {
		x.expireLocked(r, now)
	}
}

// expireLocked pops r's expired entries from its LRU tail.
func (x *Index) expireLocked(r int, now time.Duration) {
	if x.cfg.TTL <= 0 {
		return
	}
	rep := &x.replicas[r]
	for rep.tail >= 0 && now-x.entry(rep.tail).touched > x.cfg.TTL {
		x.deleteLocked(rep.tail)
	}
}

// Len returns the number of (block, replica) entries.
func (x *Index) Len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.total
}

// Blocks returns the number of entries of replica r.
func (x *Index) Blocks(r int) int {
	if !x.valid(r) {
		return 0
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.replicas[r].n
}

// EachBlocks calls f with the number of entries of every replica r < n,
// under one read lock: cheaper than Blocks for each. f must not call x.
func (x *Index) EachBlocks(n int, f func(r, blocks int)) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for r := range min(n, len(x.replicas)) {
		f(r, x.replicas[r].n)
	}
}

// CopyBlocks sets dst[r] to the number of entries of every replica r <
// len(dst) for which keep(r) (nil: every one), under one read lock: a
// dense copy, cheaper than EachBlocks' call per replica. keep must not
// call x.
func (x *Index) CopyBlocks(dst []int, keep func(r int) bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	reps := x.replicas[:min(len(dst), len(x.replicas))]
	if keep == nil {
		for r := range reps {
			dst[r] = reps[r].n
		}
		return
	}
	for r := range reps {
		if keep(r) {
			dst[r] = reps[r].n
		}
	}
}

// Has reports whether replica r holds block h (expired or not).
func (x *Index) Has(r int, h prefix.Hash) bool {
	if !x.valid(r) {
		return false
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.findLocked(r, h) >= 0
}

// Hashes returns replica r's blocks, most recently touched first (for
// comparing against an engine's true cache in tests).
func (x *Index) Hashes(r int) []prefix.Hash {
	if !x.valid(r) {
		return nil
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	out := make([]prefix.Hash, 0, x.replicas[r].n)
	for e := x.replicas[r].head; e >= 0; e = x.entry(e).next() {
		out = append(out, x.entry(e).hash)
	}
	return out
}

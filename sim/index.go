package sim

import (
	"time"

	"kvrouter/prefix"
	"kvrouter/residency"
	"kvrouter/route"
)

// index is the residency index a policy reads, with its Match buffers: one
// residency.Index per policy run, sized the way the policy's source sizes
// it.
//
// Approximate mode feeds it from routing decisions (Touch), each replica's
// share capped at Needs.IndexBlocks (or the replica's cache, in index
// blocks) and entries older than Needs.IndexTTL ignored. Precise mode
// feeds it from the engines' KV events (Store, Remove, Clear), capped at
// the engine's own block count (the events never exceed it).
type index struct {
	x     *residency.Index
	cap   int
	match []int
	age   []time.Duration
}

// newIndex returns an empty index; capacity is each replica's share in
// blocks when needs does not cap it.
func newIndex(kind route.IndexKind, needs route.Needs, capacity int) *index {
	cfg := residency.Config{MaxReplicas: residency.MaxReplicasLimit, DefaultCapacity: capacity}
	if kind == route.Approximate {
		if needs.IndexBlocks > 0 {
			cfg.DefaultCapacity = needs.IndexBlocks
		}
		cfg.TTL = needs.IndexTTL
	}
	return &index{x: residency.New(cfg), cap: cfg.DefaultCapacity}
}

// addReplica appends an empty replica.
func (x *index) addReplica() {
	// The only error is an id beyond MaxReplicasLimit, which
	// Config.withDefaults rules out.
	_ = x.x.AddReplica(len(x.match), x.cap)
	x.match = append(x.match, 0)
	x.age = append(x.age, 0)
}

// held is how many blocks the index attributes to replica i.
func (x *index) held(i int) int { return x.x.Blocks(i) }

// lookup returns, per replica, the leading blocks of hashes it holds and
// how long ago it touched the deepest of them. The slices are reused by
// the next call.
func (x *index) lookup(hashes []prefix.Hash, now time.Duration) ([]int, []time.Duration) {
	x.x.Match(hashes, now, x.match, x.age)
	return x.match, x.age
}

func (x *index) touch(i int, hashes []prefix.Hash, now time.Duration) { x.x.Touch(i, hashes, now) }
func (x *index) store(i int, hashes []prefix.Hash, now time.Duration) { x.x.Store(i, hashes, now) }
func (x *index) remove(i int, hashes []prefix.Hash)                   { x.x.Remove(i, hashes) }
func (x *index) clearReplica(i int)                                   { x.x.Clear(i) }

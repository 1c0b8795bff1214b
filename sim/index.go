package sim

import (
	"time"

	"kvrouter/prefix"
	"kvrouter/route"
)

// index is the residency index a policy reads in the simulator: block hash
// → the replicas believed to hold it, with when each last touched it.
//
// Approximate mode feeds it from routing decisions (touch), each replica's
// share capped at cap blocks (LRU) and entries older than ttl ignored.
// Precise mode feeds it from the engines' KV events (store, remove, clear).
//
// The residency package was not in the tree when the simulator was
// written; this is a small local index with the same semantics, laid out
// for the simulator's speed: entries live in slices, chained per hash and
// per replica (an LRU list), with no pointer per entry.
type index struct {
	kind route.IndexKind
	cap  int // per-replica blocks, approximate mode; 0 = unbounded
	ttl  time.Duration

	head table // first entry of the hash's chain

	// Entry slots.
	hash      []prefix.Hash
	rep       []int32
	touched   []time.Duration
	same      []int32 // next entry of the same hash
	prev, nxt []int32 // the replica's LRU list
	free      []int32

	// Per replica: LRU list ends (most recent first) and entry count.
	first, last []int32
	count       []int

	match []int
	age   []time.Duration
}

// newIndex returns an empty index; capacity is each replica's share in
// blocks when needs does not cap it.
func newIndex(kind route.IndexKind, needs route.Needs, capacity int) *index {
	x := &index{kind: kind, head: newTable(1 << 16)}
	if kind == route.Approximate {
		x.cap = capacity
		if needs.IndexBlocks > 0 {
			x.cap = needs.IndexBlocks
		}
		x.ttl = needs.IndexTTL
	}
	return x
}

// addReplica appends an empty replica.
func (x *index) addReplica() {
	x.first = append(x.first, -1)
	x.last = append(x.last, -1)
	x.count = append(x.count, 0)
	x.match = append(x.match, 0)
	x.age = append(x.age, 0)
}

// held is how many blocks the index attributes to replica i.
func (x *index) held(i int) int { return x.count[i] }

// match returns, per replica, the leading blocks of hashes it holds and how
// long ago it touched the deepest of them. The slices are reused by the
// next call.
func (x *index) lookup(hashes []prefix.Hash, now time.Duration) ([]int, []time.Duration) {
	clear(x.match)
	clear(x.age)
	for b, h := range hashes {
		advanced := false
		for e := x.headOf(h); e >= 0; e = x.same[e] {
			r := x.rep[e]
			if x.match[r] != b || (x.ttl > 0 && now-x.touched[e] > x.ttl) {
				continue
			}
			x.match[r] = b + 1
			x.age[r] = now - x.touched[e]
			advanced = true
		}
		if !advanced {
			break
		}
	}
	return x.match, x.age
}

func (x *index) headOf(h prefix.Hash) int32 {
	if e, ok := x.head.get(h); ok {
		return e
	}
	return -1
}

// find returns replica i's entry for h, or -1.
func (x *index) find(i int, h prefix.Hash) int32 {
	for e := x.headOf(h); e >= 0; e = x.same[e] {
		if int(x.rep[e]) == i {
			return e
		}
	}
	return -1
}

// touch records that replica i holds hashes as of now (most recent last
// touched root-first, so the root is the most recent, as the engine frees a
// request's tail first), evicting its least recent blocks over capacity.
func (x *index) touch(i int, hashes []prefix.Hash, now time.Duration) {
	for k := len(hashes) - 1; k >= 0; k-- {
		x.put(i, hashes[k], now)
	}
	for x.cap > 0 && x.count[i] > x.cap {
		x.drop(x.last[i])
	}
	for x.ttl > 0 && x.last[i] >= 0 && now-x.touched[x.last[i]] > x.ttl {
		x.drop(x.last[i])
	}
}

// store records blocks a KV event reported stored on replica i.
func (x *index) store(i int, hashes []prefix.Hash, now time.Duration) {
	for _, h := range hashes {
		x.put(i, h, now)
	}
}

// remove forgets blocks a KV event reported removed from replica i.
func (x *index) remove(i int, hashes []prefix.Hash) {
	for _, h := range hashes {
		if e := x.find(i, h); e >= 0 {
			x.drop(e)
		}
	}
}

// clearReplica forgets every block of replica i.
func (x *index) clearReplica(i int) {
	for x.first[i] >= 0 {
		x.drop(x.first[i])
	}
}

// put inserts or refreshes (i, h) at the front of i's LRU list.
func (x *index) put(i int, h prefix.Hash, now time.Duration) {
	e := x.find(i, h)
	if e >= 0 {
		x.unlink(e)
	} else {
		e = x.alloc()
		x.hash[e], x.rep[e] = h, int32(i)
		x.same[e] = x.headOf(h)
		x.head.put(h, e)
		x.count[i]++
	}
	x.touched[e] = now
	x.prev[e], x.nxt[e] = -1, x.first[i]
	if x.first[i] >= 0 {
		x.prev[x.first[i]] = e
	}
	x.first[i] = e
	if x.last[i] < 0 {
		x.last[i] = e
	}
}

func (x *index) alloc() int32 {
	if n := len(x.free); n > 0 {
		e := x.free[n-1]
		x.free = x.free[:n-1]
		return e
	}
	x.hash = append(x.hash, 0)
	x.rep = append(x.rep, 0)
	x.touched = append(x.touched, 0)
	x.same = append(x.same, -1)
	x.prev = append(x.prev, -1)
	x.nxt = append(x.nxt, -1)
	return int32(len(x.hash) - 1)
}

// unlink takes e out of its replica's LRU list.
func (x *index) unlink(e int32) {
	i := x.rep[e]
	p, n := x.prev[e], x.nxt[e]
	if p >= 0 {
		x.nxt[p] = n
	} else {
		x.first[i] = n
	}
	if n >= 0 {
		x.prev[n] = p
	} else {
		x.last[i] = p
	}
}

// drop deletes entry e.
func (x *index) drop(e int32) {
	x.unlink(e)
	h := x.hash[e]
	if x.headOf(h) == e {
		if x.same[e] >= 0 {
			x.head.put(h, x.same[e])
		} else {
			x.head.del(h)
		}
	} else {
		for p := x.headOf(h); p >= 0; p = x.same[p] {
			if x.same[p] == e {
				x.same[p] = x.same[e]
				break
			}
		}
	}
	x.count[x.rep[e]]--
	x.free = append(x.free, e)
}

package residency

import "github.com/kvrouter/kvrouter/prefix"

// table is an open-addressing hash table from block hash to node, with
// linear probing and backward-shift deletion: no tombstones, so lookups stay
// short under the steady insert/evict churn of an LRU (Go's built-in map
// degrades there: measured 3.4 µs per touched block before this table).
//
// A slot is 4 bytes, not the key and its node: it refers to the block's
// only entry (most blocks have one holder), whose hash is the key, or to a
// group (a block with several holders: its hash and node). It keeps its
// key's distance from its home slot (up to 6; 7 means 7 or more) and 2
// bits of the hash as a tag, so that a probe rarely loads a key that is
// not its own (only one of its home, and of its tag), and a deletion
// knows the homes of the keys it shifts back without loading them. Zero
// is an empty slot. The table's methods are the Index's, which resolve
// references.
type table struct {
	slots []uint32
	mask  uint64
	shift uint // 64 - log2(len(slots))
	n     int
}

// A slot: the id plus one of an entry, or of a group when groupRef is set,
// in its low idBits, then the distance and the tag.
const (
	groupRef  = 1 << 31
	distShift = idBits
	distMask  = 7 << distShift
	farDist   = 7 // a distance of 7 or more
	tagShift  = idBits + 3
	tagMask   = 3 << tagShift
)

// group is a block with several holders (a node with count > 1, or hot).
type group struct {
	hash prefix.Hash
	nd   node // nd.head links the free groups when the group is free
}

// minSlots is a new table's size.
const minSlots = 1024

func newTable() table {
	return table{slots: make([]uint32, minSlots), mask: minSlots - 1, shift: 64 - 10}
}

// home returns h's preferred slot, by Fibonacci hashing (the top bits of
// h times 2^64/φ): hashes from prefix are already uniform, and the multiply
// spreads test and trace ids that are not.
func (t *table) home(h prefix.Hash) uint64 {
	return (uint64(h) * 0x9E3779B97F4A7C15) >> t.shift
}

// tagOf returns h's tag bits, from another multiply than home's so that
// keys sharing a home rarely share a tag.
func tagOf(h prefix.Hash) uint32 {
	return uint32(uint64(h)*0xBF58476D1CE4E5B9>>62) << tagShift
}

// distBits returns the bits of a distance d from home.
func distBits(d uint64) uint32 { return uint32(min(d, farDist)) << distShift }

// mayHold reports whether slot s, d slots from the home of a key whose
// tag is tag, may hold that key: a key of that home and that tag.
func mayHold(s, tag uint32, d uint64) bool {
	if s&tagMask != tag {
		return false
	}
	sd := uint64(s&distMask) >> distShift
	return sd == min(d, farDist)
}

// homeOf returns the home of the key of slot s at position j.
func (x *Index) homeOf(s uint32, j uint64) uint64 {
	t := &x.nodes
	if d := uint64(s&distMask) >> distShift; d < farDist {
		return (j - d) & t.mask
	}
	return t.home(x.keyOf(s))
}

// keyOf returns the hash slot s refers to.
func (x *Index) keyOf(s uint32) prefix.Hash {
	id := int32(s&idMask) - 1
	if s&groupRef != 0 {
		return x.groups[id].hash
	}
	return x.entry(id).hash
}

// slotOf returns h's slot and true, or the empty slot ending its probe run
// and false.
func (x *Index) slotOf(h prefix.Hash) (uint64, bool) {
	t := &x.nodes
	tag := tagOf(h)
	for i, d := t.home(h), uint64(0); ; i, d = (i+1)&t.mask, d+1 {
		s := t.slots[i]
		if s == 0 {
			return i, false
		}
		if mayHold(s, tag, d) && x.keyOf(s) == h {
			return i, true
		}
	}
}

// getNode returns h's node.
func (x *Index) getNode(h prefix.Hash) (node, bool) {
	_, nd, ok := x.lookupLocked(h)
	return nd, ok
}

// lookupLocked returns h's slot and node, or the empty slot ending its
// probe run, no node and false.
func (x *Index) lookupLocked(h prefix.Hash) (uint64, node, bool) {
	t := &x.nodes
	tag := tagOf(h)
	for i, d := t.home(h), uint64(0); ; i, d = (i+1)&t.mask, d+1 {
		s := t.slots[i]
		if s == 0 {
			return i, node{}, false
		}
		if !mayHold(s, tag, d) {
			continue
		}
		id := int32(s&idMask) - 1
		if s&groupRef != 0 {
			if g := &x.groups[id]; g.hash == h {
				return i, g.nd, true
			}
		} else if x.entry(id).hash == h {
			return i, node{head: id, count: 1}, true
		}
	}
}

// putNode sets h's node; nd.count must not be zero, and with count 1
// nd.head must be an entry of h.
func (x *Index) putNode(h prefix.Hash, nd node) {
	i, ok := x.slotOf(h)
	x.setSlotLocked(i, ok, h, nd)
}

// setSlotLocked sets h's node in slot i, h's slot (found) or the empty
// slot ending its probe run, as lookupLocked returned it with no write
// since; nd as putNode's.
func (x *Index) setSlotLocked(i uint64, found bool, h prefix.Hash, nd node) {
	t := &x.nodes
	old := t.slots[i]
	var s uint32
	switch {
	case nd.count == 1:
		if old&groupRef != 0 {
			x.freeGroupLocked(int32(old&idMask) - 1)
		}
		s = uint32(nd.head + 1)
	case old&groupRef != 0:
		x.groups[old&idMask-1].nd = nd
		return
	default:
		s = groupRef | uint32(x.allocGroupLocked(h, nd)+1)
	}
	t.slots[i] = s | tagOf(h) | distBits((i-t.home(h))&t.mask)
	if !found {
		t.n++
		if t.n*4 > len(t.slots)*3 {
			x.growTable()
		}
	}
}

// delNode removes h.
func (x *Index) delNode(h prefix.Hash) {
	if i, ok := x.slotOf(h); ok {
		x.delSlotLocked(i)
	}
}

// delSlotLocked empties slot i, shifting later slots of its probe run
// back.
func (x *Index) delSlotLocked(i uint64) {
	t := &x.nodes
	if s := t.slots[i]; s&groupRef != 0 {
		x.freeGroupLocked(int32(s&idMask) - 1)
	}
	t.n--
	for j := (i + 1) & t.mask; ; j = (j + 1) & t.mask {
		s := t.slots[j]
		if s == 0 {
			break
		}
		// s may move to i if its home is not in (i, j] cyclically.
		k := x.homeOf(s, j)
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			t.slots[i] = s&^distMask | distBits((i-k)&t.mask)
			i = j
		}
	}
	t.slots[i] = 0
}

// growTable doubles the table.
func (x *Index) growTable() {
	t := &x.nodes
	old := t.slots
	t.slots = make([]uint32, 2*len(old))
	t.mask = uint64(len(t.slots) - 1)
	t.shift--
	for _, s := range old {
		if s == 0 {
			continue
		}
		k := t.home(x.keyOf(s))
		i := k
		for t.slots[i] != 0 {
			i = (i + 1) & t.mask
		}
		t.slots[i] = s&^distMask | distBits((i-k)&t.mask)
	}
}

// allocGroupLocked returns a new group of h with node nd.
func (x *Index) allocGroupLocked(h prefix.Hash, nd node) int32 {
	g := x.freeGroup
	if g >= 0 {
		x.freeGroup = x.groups[g].nd.head
	} else {
		x.groups = append(x.groups, group{})
		g = int32(len(x.groups) - 1)
	}
	x.groups[g] = group{hash: h, nd: nd}
	return g
}

// freeGroupLocked frees group g.
func (x *Index) freeGroupLocked(g int32) {
	x.groups[g] = group{nd: node{head: x.freeGroup}}
	x.freeGroup = g
}

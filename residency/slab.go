package residency

import (
	"time"

	"github.com/kvrouter/kvrouter/prefix"
)

// Entry ids are 26 bits: the links of an entry and the references of the
// hash table keep them in the low bits of a uint32 (plus one, so that zero
// means none) and use the 6 bits above for the replica or a tag.
const (
	idBits = 26
	idMask = 1<<idBits - 1
	// MaxEntries is the most (block, replica) entries an Index holds, about
	// 67 million (1.6 GB). A write that would add one more first evicts
	// its replica's least recently touched entry; a replica holding none
	// is not given one.
	MaxEntries = idMask - 1
)

// entry is one (block, replica): 24 bytes.
type entry struct {
	hash prefix.Hash
	// touched is the last touch, or heldStamp while a request holds the
	// block (the count is then in Index.held).
	touched time.Duration
	// prevW and nextW link the replica's LRU list, most recent first:
	// entry id plus one in their low idBits (zero ends the list), and the
	// replica's id, 6 bits in each, above.
	prevW, nextW uint32
}

func (en *entry) prev() int32 { return int32(en.prevW&idMask) - 1 }
func (en *entry) next() int32 { return int32(en.nextW&idMask) - 1 }

func (en *entry) setPrev(e int32) { en.prevW = en.prevW&^idMask | uint32(e+1) }
func (en *entry) setNext(e int32) { en.nextW = en.nextW&^idMask | uint32(e+1) }

// replica returns the entry's replica.
func (en *entry) replica() int32 {
	return int32(en.prevW>>idBits | en.nextW>>idBits<<(32-idBits))
}

// setReplica sets the entry's replica, r < MaxReplicasLimit.
func (en *entry) setReplica(r int32) {
	en.prevW = en.prevW&idMask | uint32(r)<<idBits
	en.nextW = en.nextW&idMask | uint32(r)>>(32-idBits)<<idBits
}

// The entries live in chunks of chunkLen: growing the slab allocates a
// chunk and copies nothing, so that the spare capacity is at most one
// chunk (a flat slab grown by an eighth kept up to 3 bytes an entry, and
// stalled writers while it copied). The first chunk starts small and
// doubles, so that a small index stays small.
const (
	chunkBits  = 16
	chunkLen   = 1 << chunkBits
	firstChunk = 64
)

// entry returns entry e.
func (x *Index) entry(e int32) *entry { return &x.chunks[e>>chunkBits][e&(chunkLen-1)] }

// allocLocked returns a free entry index; there must be fewer than
// MaxEntries.
func (x *Index) allocLocked() int32 {
	if e := x.freeEnt; e >= 0 {
		x.freeEnt = x.entry(e).next()
		return e
	}
	n := len(x.chunks)
	if n == 0 || len(x.chunks[n-1]) == chunkLen {
		c := chunkLen
		if n == 0 {
			c = firstChunk
		}
		x.chunks = append(x.chunks, make([]entry, 0, c))
		n++
	}
	last := &x.chunks[n-1]
	if len(*last) == cap(*last) { // the first chunk, still growing
		grown := make([]entry, len(*last), 2*cap(*last))
		copy(grown, *last)
		*last = grown
	}
	*last = append(*last, entry{})
	return int32((n-1)<<chunkBits + len(*last) - 1)
}

// freeLocked returns entry e to the free list.
func (x *Index) freeLocked(e int32) {
	en := x.entry(e)
	*en = entry{}
	en.setNext(x.freeEnt)
	x.freeEnt = e
}

// heldCount returns how many requests hold entry e (Hold less Release).
func (x *Index) heldCount(e int32) int32 {
	if x.entry(e).touched != heldStamp {
		return 0
	}
	return x.held[e]
}

package residency

import (
	"math/bits"
	"slices"
	"time"

	"kvrouter/prefix"
)

// upsertLocked inserts or refreshes (r, h) at now and makes it r's most
// recent entry, evicting r's oldest entry first if r is full.
func (x *Index) upsertLocked(r int, h prefix.Hash, now time.Duration) {
	if e := x.findLocked(r, h); e >= 0 {
		x.refreshLocked(e, now)
		return
	}
	rep := &x.replicas[r]
	for rep.n >= rep.cap && rep.tail >= 0 {
		x.deleteLocked(rep.tail)
	}
	e := x.allocLocked()
	*x.entry(e) = entry{touched: now, hash: h, replica: int32(r), prev: -1, next: -1, nextSame: -1}
	x.pushFrontLocked(r, e)
	x.total++
	nd, ok := x.nodes.get(h)
	switch {
	case !ok:
		x.nodes.put(h, node{head: e, count: 1})
	case nd.count < 0:
		x.hotInsertLocked(&x.hots[-nd.count-1], r, e, now)
	default:
		x.entry(e).nextSame = nd.head
		nd.head = e
		nd.count++
		if nd.count >= hotAt {
			nd = x.promoteLocked(nd)
		}
		x.nodes.put(h, nd)
	}
}

// refreshLocked stamps entry e with now and moves it to its replica's front.
func (x *Index) refreshLocked(e int32, now time.Duration) {
	en := x.entry(e)
	en.touched = now
	r := int(en.replica)
	if nd, _ := x.nodes.get(en.hash); nd.count < 0 {
		hb := &x.hots[-nd.count-1]
		k := hb.rank(r)
		old := hb.touched[k]
		hb.touched[k] = now
		if old == hb.oldest && x.cfg.TTL > 0 {
			hb.oldest = slices.Min(hb.touched)
		}
	}
	x.unlinkLocked(r, e)
	x.pushFrontLocked(r, e)
}

// findLocked returns the entry of (r, h), or -1.
func (x *Index) findLocked(r int, h prefix.Hash) int32 {
	nd, ok := x.nodes.get(h)
	if !ok {
		return -1
	}
	if nd.count < 0 {
		hb := &x.hots[-nd.count-1]
		if hb.bits[r>>6]&(1<<(r&63)) == 0 {
			return -1
		}
		return hb.entries[hb.rank(r)]
	}
	for e := nd.head; e >= 0; e = x.entry(e).nextSame {
		if int(x.entry(e).replica) == r {
			return e
		}
	}
	return -1
}

// deleteLocked removes entry e from its replica and its node, and frees it.
func (x *Index) deleteLocked(e int32) {
	en := *x.entry(e)
	r := int(en.replica)
	x.unlinkLocked(r, e)
	x.total--
	nd, _ := x.nodes.get(en.hash)
	if nd.count < 0 {
		hi := -nd.count - 1
		hb := &x.hots[hi]
		k := hb.rank(r)
		hb.bits[r>>6] &^= 1 << (r & 63)
		hb.touched = slices.Delete(hb.touched, k, k+1)
		hb.entries = slices.Delete(hb.entries, k, k+1)
		if len(hb.entries) < coldAt {
			x.nodes.put(en.hash, x.demoteLocked(hi))
		}
	} else {
		if nd.head == e {
			nd.head = en.nextSame
		} else {
			p := nd.head
			for x.entry(p).nextSame != e {
				p = x.entry(p).nextSame
			}
			x.entry(p).nextSame = en.nextSame
		}
		nd.count--
		if nd.count == 0 {
			x.nodes.del(en.hash)
		} else {
			x.nodes.put(en.hash, nd)
		}
	}
	*x.entry(e) = entry{next: x.freeEnt}
	x.freeEnt = e
}

// entry returns entry e.
func (x *Index) entry(e int32) *entry { return &x.entries[e] }

// slabStep is the fewest entries the slab grows by.
const slabStep = 1 << 14

// allocLocked returns a free entry index.
func (x *Index) allocLocked() int32 {
	if e := x.freeEnt; e >= 0 {
		x.freeEnt = x.entry(e).next
		return e
	}
	if len(x.entries) == cap(x.entries) {
		// Grow by an eighth, not append's quarter: at most about 3.5 bytes
		// per entry of spare capacity, in one flat slab (a chunked one
		// costs Match an extra dependent load per entry).
		grown := make([]entry, len(x.entries), cap(x.entries)+max(cap(x.entries)/8, slabStep))
		copy(grown, x.entries)
		x.entries = grown
	}
	x.entries = append(x.entries, entry{})
	return int32(len(x.entries) - 1)
}

// pushFrontLocked links e at the front of r's LRU list.
func (x *Index) pushFrontLocked(r int, e int32) {
	rep := &x.replicas[r]
	en := x.entry(e)
	en.prev, en.next = -1, rep.head
	if rep.head >= 0 {
		x.entry(rep.head).prev = e
	} else {
		rep.tail = e
	}
	rep.head = e
	rep.n++
}

// unlinkLocked removes e from r's LRU list.
func (x *Index) unlinkLocked(r int, e int32) {
	rep := &x.replicas[r]
	en := x.entry(e)
	if en.prev >= 0 {
		x.entry(en.prev).next = en.next
	} else {
		rep.head = en.next
	}
	if en.next >= 0 {
		x.entry(en.next).prev = en.prev
	} else {
		rep.tail = en.prev
	}
	en.prev, en.next = -1, -1
	rep.n--
}

// promoteLocked turns a cold node's chain into a hot holder set.
func (x *Index) promoteLocked(nd node) node {
	var hi int32
	if n := len(x.freeHot); n > 0 {
		hi = x.freeHot[n-1]
		x.freeHot = x.freeHot[:n-1]
	} else {
		x.hots = append(x.hots, hot{})
		hi = int32(len(x.hots) - 1)
	}
	hb := &x.hots[hi]
	if hb.bits == nil {
		hb.bits = make([]uint64, x.words)
	}
	hb.oldest = 1<<63 - 1
	for e := nd.head; e >= 0; e = x.entry(e).nextSame {
		r := int(x.entry(e).replica)
		hb.bits[r>>6] |= 1 << (r & 63)
	}
	hb.touched = slices.Grow(hb.touched[:0], int(nd.count))[:nd.count]
	hb.entries = slices.Grow(hb.entries[:0], int(nd.count))[:nd.count]
	for e := nd.head; e >= 0; {
		en := x.entry(e)
		k := hb.rank(int(en.replica))
		hb.touched[k], hb.entries[k] = en.touched, e
		hb.oldest = min(hb.oldest, en.touched)
		e, en.nextSame = en.nextSame, -1
	}
	return node{head: -1, count: -hi - 1}
}

// demoteLocked turns hot holder set hi back into a chain and frees it.
func (x *Index) demoteLocked(hi int32) node {
	hb := &x.hots[hi]
	nd := node{head: -1, count: int32(len(hb.entries))}
	for _, e := range hb.entries {
		x.entry(e).nextSame = nd.head
		nd.head = e
	}
	clear(hb.bits)
	hb.touched, hb.entries = hb.touched[:0], hb.entries[:0]
	x.freeHot = append(x.freeHot, hi)
	return nd
}

// hotInsertLocked adds holder r (entry e, touched now) to hb.
func (x *Index) hotInsertLocked(hb *hot, r int, e int32, now time.Duration) {
	hb.bits[r>>6] |= 1 << (r & 63)
	k := hb.rank(r)
	hb.touched = slices.Insert(hb.touched, k, now)
	hb.entries = slices.Insert(hb.entries, k, e)
	if x.cfg.TTL > 0 && now-hb.oldest > x.cfg.TTL {
		hb.oldest = slices.Min(hb.touched)
	}
}

// rank returns the number of holders below replica r.
func (hb *hot) rank(r int) int {
	n := 0
	w := r >> 6
	for _, b := range hb.bits[:w] {
		n += bits.OnesCount64(b)
	}
	return n + bits.OnesCount64(hb.bits[w]&(1<<(r&63)-1))
}

package residency

import (
	"math/bits"
	"slices"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
)

// upsertLocked inserts or refreshes (r, h) at now and makes it r's most
// recent entry, evicting r's oldest entry first if r is full (or the index
// holds MaxEntries); it returns the entry, or -1 when the index is full and
// r holds nothing to evict.
func (x *Index) upsertLocked(r int, h prefix.Hash, now time.Duration) int32 {
	i, nd, ok := x.lookupLocked(h)
	if ok {
		if e := x.holderLocked(nd, r); e >= 0 {
			x.refreshLocked(e, nd, now)
			return e
		}
	}
	rep := &x.replicas[r]
	evicted := false
	for (rep.n >= rep.cap || x.total >= x.maxEntries) && rep.tail >= 0 {
		x.deleteLocked(rep.tail)
		evicted = true
	}
	if x.total >= x.maxEntries {
		return -1
	}
	if evicted { // the table may have moved h's slot
		i, nd, ok = x.lookupLocked(h)
	}
	e := x.allocLocked()
	en := x.entry(e)
	*en = entry{touched: now, hash: h}
	en.setReplica(int32(r))
	x.pushFrontLocked(r, e)
	x.total++
	switch {
	case !ok:
		x.setSlotLocked(i, false, h, node{head: e, count: 1})
	case nd.count < 0:
		x.hotInsertLocked(&x.hots[-nd.count-1], r, e, now)
	case nd.count == 1:
		off := x.allocRunLocked(2)
		x.holders[off] = holder{entry: nd.head, replica: x.entry(nd.head).replica()}
		x.holders[off+1] = holder{entry: e, replica: int32(r)}
		x.setSlotLocked(i, true, h, node{head: off, count: 2})
	default:
		if c := int(nd.count); c == runCap(c) { // full: move to a run twice as long
			off := x.allocRunLocked(2 * c)
			copy(x.holders[off:int(off)+c], x.holders[nd.head:int(nd.head)+c])
			x.freeRunLocked(nd.head, c)
			nd.head = off
		}
		x.holders[nd.head+nd.count] = holder{entry: e, replica: int32(r)}
		nd.count++
		if nd.count >= hotAt {
			nd = x.promoteLocked(nd)
		}
		x.setSlotLocked(i, true, h, nd)
	}
	return e
}

// refreshLocked stamps entry e, of node nd, with now and moves it to its
// replica's front.
func (x *Index) refreshLocked(e int32, nd node, now time.Duration) {
	x.stampNodeLocked(e, nd, now)
	r := int(x.entry(e).replica())
	x.unlinkLocked(r, e)
	x.pushFrontLocked(r, e)
}

// stampLocked sets entry e's touched stamp to now, or keeps heldStamp
// while it is held, in its hot holder set too.
func (x *Index) stampLocked(e int32, now time.Duration) {
	nd, _ := x.getNode(x.entry(e).hash)
	x.stampNodeLocked(e, nd, now)
}

// stampNodeLocked is stampLocked of an entry of node nd.
func (x *Index) stampNodeLocked(e int32, nd node, now time.Duration) {
	en := x.entry(e)
	if en.touched == heldStamp {
		now = heldStamp
	}
	en.touched = now
	if nd.count < 0 {
		hb := &x.hots[-nd.count-1]
		k := hb.rank(int(en.replica()))
		old := hb.touched[k]
		hb.touched[k] = now
		if old == hb.oldest && x.cfg.TTL > 0 {
			hb.oldest = slices.Min(hb.touched)
		}
	}
}

// findLocked returns the entry of (r, h), or -1.
func (x *Index) findLocked(r int, h prefix.Hash) int32 {
	nd, ok := x.getNode(h)
	if !ok {
		return -1
	}
	return x.holderLocked(nd, r)
}

// holderLocked returns the entry of replica r among the holders of nd, or
// -1.
func (x *Index) holderLocked(nd node, r int) int32 {
	if nd.count < 0 {
		hb := &x.hots[-nd.count-1]
		if hb.bits[r>>6]&(1<<(r&63)) == 0 {
			return -1
		}
		return hb.entries[hb.rank(r)]
	}
	if nd.count == 1 {
		if int(x.entry(nd.head).replica()) == r {
			return nd.head
		}
		return -1
	}
	for _, h := range x.run(nd) {
		if int(h.replica) == r {
			return h.entry
		}
	}
	return -1
}

// run returns the holders of a node with 2 to hotAt-1 holders.
func (x *Index) run(nd node) []holder {
	return x.holders[nd.head : nd.head+nd.count]
}

// holder is one holder of a node with 2 to hotAt-1 holders: its entry, and
// its replica, so that Match need not load the entry.
type holder struct {
	entry, replica int32
}

// runCap returns the slots of the run of a node with n >= 2 holders: the
// power of two at least n.
func runCap(n int) int { return 1 << bits.Len(uint(n-1)) }

// allocRunLocked returns the offset of a free run of c slots (2, 4, 8 or 16).
func (x *Index) allocRunLocked(c int) int32 {
	k := bits.TrailingZeros(uint(c)) - 1
	if off := x.freeRun[k]; off >= 0 {
		x.freeRun[k] = x.holders[off].entry
		return off
	}
	off := int32(len(x.holders))
	for range c {
		x.holders = append(x.holders, holder{entry: -1})
	}
	return off
}

// freeRunLocked frees the run of c slots at off.
func (x *Index) freeRunLocked(off int32, c int) {
	k := bits.TrailingZeros(uint(c)) - 1
	x.holders[off] = holder{entry: x.freeRun[k]}
	x.freeRun[k] = off
}

// deleteLocked removes entry e from its replica and its node, and frees it.
func (x *Index) deleteLocked(e int32) {
	en := *x.entry(e)
	r := int(en.replica())
	x.unlinkLocked(r, e)
	x.total--
	i, nd, _ := x.lookupLocked(en.hash)
	if nd.count < 0 {
		hi := -nd.count - 1
		hb := &x.hots[hi]
		k := hb.rank(r)
		hb.bits[r>>6] &^= 1 << (r & 63)
		hb.touched = slices.Delete(hb.touched, k, k+1)
		hb.entries = slices.Delete(hb.entries, k, k+1)
		if len(hb.entries) < coldAt {
			x.setNodeLocked(i, en.hash, x.demoteLocked(hi))
		}
	} else {
		x.setNodeLocked(i, en.hash, x.coldDeleteLocked(nd, e))
	}
	if en.touched == heldStamp {
		delete(x.held, e)
	}
	x.freeLocked(e)
}

// setNodeLocked sets h's node in its slot i, deleting h when nd has no
// holder.
func (x *Index) setNodeLocked(i uint64, h prefix.Hash, nd node) {
	if nd.count == 0 {
		x.delSlotLocked(i)
		return
	}
	x.setSlotLocked(i, true, h, nd)
}

// coldDeleteLocked removes holder e from cold node nd and returns the node
// left (which has count zero when e was its last holder).
func (x *Index) coldDeleteLocked(nd node, e int32) node {
	c := int(nd.count)
	switch c {
	case 1:
		return node{}
	case 2:
		other := x.holders[nd.head].entry
		if other == e {
			other = x.holders[nd.head+1].entry
		}
		x.freeRunLocked(nd.head, 2)
		return node{head: other, count: 1}
	}
	hs := x.run(nd)
	k := 0
	for hs[k].entry != e {
		k++
	}
	hs[k] = hs[c-1]
	nd.count--
	if n := c - 1; runCap(n) < runCap(c) { // shrink to the smaller run
		off := x.allocRunLocked(runCap(n))
		copy(x.holders[off:int(off)+n], x.holders[nd.head:int(nd.head)+n])
		x.freeRunLocked(nd.head, runCap(c))
		nd.head = off
	}
	return nd
}

// pushFrontLocked links e at the front of r's LRU list.
func (x *Index) pushFrontLocked(r int, e int32) {
	rep := &x.replicas[r]
	en := x.entry(e)
	en.setPrev(-1)
	en.setNext(rep.head)
	if rep.head >= 0 {
		x.entry(rep.head).setPrev(e)
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
	prev, next := en.prev(), en.next()
	if prev >= 0 {
		x.entry(prev).setNext(next)
	} else {
		rep.head = next
	}
	if next >= 0 {
		x.entry(next).setPrev(prev)
	} else {
		rep.tail = prev
	}
	en.setPrev(-1)
	en.setNext(-1)
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
	hs := x.run(nd)
	for _, h := range hs {
		hb.bits[h.replica>>6] |= 1 << (h.replica & 63)
	}
	hb.touched = slices.Grow(hb.touched[:0], len(hs))[:len(hs)]
	hb.entries = slices.Grow(hb.entries[:0], len(hs))[:len(hs)]
	for _, h := range hs {
		e := h.entry
		en := x.entry(e)
		k := hb.rank(int(en.replica()))
		hb.touched[k], hb.entries[k] = en.touched, e
		hb.oldest = min(hb.oldest, en.touched)
	}
	x.freeRunLocked(nd.head, runCap(len(hs)))
	return node{head: -1, count: -hi - 1}
}

// demoteLocked turns hot holder set hi back into a cold node and frees it.
func (x *Index) demoteLocked(hi int32) node {
	hb := &x.hots[hi]
	var nd node
	switch n := len(hb.entries); n {
	case 0:
	case 1:
		nd = node{head: hb.entries[0], count: 1}
	default:
		nd = node{head: x.allocRunLocked(runCap(n)), count: int32(n)}
		for k, e := range hb.entries {
			x.holders[int(nd.head)+k] = holder{entry: e, replica: x.entry(e).replica()}
		}
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

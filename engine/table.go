package engine

import "github.com/kvrouter/kvrouter/prefix"

// table maps a cached block's hash to its index in the pool. It is an
// open-addressing hash table with linear probing and backward-shift
// deletion: a pool keeps it at a steady size under constant churn (every
// eviction deletes, every stored block inserts), where Go's map collects
// tombstones and slows its probes down. It never grows: the pool sizes it
// for every block at a load of at most one half.
type table struct {
	slots []slot
	mask  uint64
	shift uint
	n     int
}

// slot holds one entry; blk is the block index plus one, zero when empty.
type slot struct {
	h   prefix.Hash
	blk int32
}

// newTable returns a table for up to n entries.
func newTable(n int) table {
	size, bits := 16, uint(4)
	for size < 2*n {
		size *= 2
		bits++
	}
	return table{slots: make([]slot, size), mask: uint64(size - 1), shift: 64 - bits}
}

// home is h's first probe position; the multiply spreads hashes that are
// not uniform (such as trace block ids).
func (t *table) home(h prefix.Hash) uint64 {
	return uint64(h) * 0x9E3779B97F4A7C15 >> t.shift
}

// get returns the block holding h.
func (t *table) get(h prefix.Hash) (int32, bool) {
	for i := t.home(h); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.blk == 0 {
			return 0, false
		}
		if s.h == h {
			return s.blk - 1, true
		}
	}
}

// add records h → blk in one probe and reports true, or reports false if
// h is already present.
func (t *table) add(h prefix.Hash, blk int32) bool {
	i := t.home(h)
	for t.slots[i].blk != 0 {
		if t.slots[i].h == h {
			return false
		}
		i = (i + 1) & t.mask
	}
	t.slots[i] = slot{h: h, blk: blk + 1}
	t.n++
	return true
}

// del removes h, shifting later entries of its probe run back.
func (t *table) del(h prefix.Hash) {
	i := t.home(h)
	for {
		if t.slots[i].blk == 0 {
			return
		}
		if t.slots[i].h == h {
			break
		}
		i = (i + 1) & t.mask
	}
	t.n--
	for j := (i + 1) & t.mask; t.slots[j].blk != 0; j = (j + 1) & t.mask {
		k := t.home(t.slots[j].h)
		// Move j back to i unless its home lies cyclically in (i, j].
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = slot{}
}

// clear removes every entry.
func (t *table) clear() {
	clear(t.slots)
	t.n = 0
}

// all appends every hash to out.
func (t *table) all(out []prefix.Hash) []prefix.Hash {
	for _, s := range t.slots {
		if s.blk != 0 {
			out = append(out, s.h)
		}
	}
	return out
}

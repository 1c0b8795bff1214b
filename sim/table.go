package sim

import "github.com/kvrouter/kvrouter/prefix"

// table maps block hashes to int32 values: open addressing, linear probing
// and backward-shift deletion, growing at half load. The index, the pooled
// oracle and the infinite oracle churn through millions of hashes (every
// eviction deletes, every new block inserts), where Go's map collects
// tombstones and its probes slow down (the profile of the Mooncake run
// spent most of its time in map probing before this).
type table struct {
	slots []tslot
	mask  uint64
	shift uint
	n     int
}

// tslot is one entry; v is the value plus one, zero when empty.
type tslot struct {
	h prefix.Hash
	v int32
}

// newTable returns a table sized for about n entries.
func newTable(n int) table {
	var t table
	t.resize(max(n, 8))
	return t
}

func (t *table) resize(n int) {
	size, bits := 16, uint(4)
	for size < 2*n {
		size *= 2
		bits++
	}
	old := t.slots
	t.slots, t.mask, t.shift, t.n = make([]tslot, size), uint64(size-1), 64-bits, 0
	for _, s := range old {
		if s.v != 0 {
			t.put(s.h, s.v-1)
		}
	}
}

// home is h's first probe position; the multiply spreads hashes that are
// not uniform.
func (t *table) home(h prefix.Hash) uint64 {
	return uint64(h) * 0x9E3779B97F4A7C15 >> t.shift
}

// get returns the value of h.
func (t *table) get(h prefix.Hash) (int32, bool) {
	for i := t.home(h); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.v == 0 {
			return 0, false
		}
		if s.h == h {
			return s.v - 1, true
		}
	}
}

// put sets h → v, inserting or overwriting.
func (t *table) put(h prefix.Hash, v int32) {
	if 2*(t.n+1) > len(t.slots) {
		t.resize(2 * (t.n + 1))
	}
	i := t.home(h)
	for t.slots[i].v != 0 {
		if t.slots[i].h == h {
			t.slots[i].v = v + 1
			return
		}
		i = (i + 1) & t.mask
	}
	t.slots[i] = tslot{h: h, v: v + 1}
	t.n++
}

// del removes h, shifting later entries of its probe run back.
func (t *table) del(h prefix.Hash) {
	i := t.home(h)
	for {
		if t.slots[i].v == 0 {
			return
		}
		if t.slots[i].h == h {
			break
		}
		i = (i + 1) & t.mask
	}
	t.n--
	for j := (i + 1) & t.mask; t.slots[j].v != 0; j = (j + 1) & t.mask {
		k := t.home(t.slots[j].h)
		// Move j back to i unless its home lies cyclically in (i, j].
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = tslot{}
}

package residency

import "github.com/kvrouter/kvrouter/prefix"

// table is an open-addressing hash table from block hash to node, with
// linear probing and backward-shift deletion: no tombstones, so lookups stay
// short under the steady insert/evict churn of an LRU (Go's built-in map
// degrades there: measured 3.4 µs per touched block before this table).
// A slot is empty when its node's count is zero.
type table struct {
	slots []slot
	mask  uint64
	shift uint // 64 - log2(len(slots))
	n     int
}

type slot struct {
	hash prefix.Hash
	nd   node
}

// minSlots is a new table's size.
const minSlots = 1024

func newTable() table {
	return table{slots: make([]slot, minSlots), mask: minSlots - 1, shift: 64 - 10}
}

// home returns h's preferred slot, by Fibonacci hashing (the top bits of
// h times 2^64/φ): hashes from prefix are already uniform, and the multiply
// spreads test and trace ids that are not.
func (t *table) home(h prefix.Hash) uint64 {
	return (uint64(h) * 0x9E3779B97F4A7C15) >> t.shift
}

// get returns h's node.
func (t *table) get(h prefix.Hash) (node, bool) {
	for i := t.home(h); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.nd.count == 0 {
			return node{}, false
		}
		if s.hash == h {
			return s.nd, true
		}
	}
}

// put sets h's node; nd.count must not be zero.
func (t *table) put(h prefix.Hash, nd node) {
	for i := t.home(h); ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.nd.count == 0 {
			*s = slot{hash: h, nd: nd}
			t.n++
			if t.n*4 > len(t.slots)*3 {
				t.grow()
			}
			return
		}
		if s.hash == h {
			s.nd = nd
			return
		}
	}
}

// del removes h, shifting later slots of its probe run back.
func (t *table) del(h prefix.Hash) {
	i := t.home(h)
	for ; ; i = (i + 1) & t.mask {
		s := &t.slots[i]
		if s.nd.count == 0 {
			return
		}
		if s.hash == h {
			break
		}
	}
	t.n--
	for j := (i + 1) & t.mask; ; j = (j + 1) & t.mask {
		s := t.slots[j]
		if s.nd.count == 0 {
			break
		}
		// s may move to i if its home is not in (i, j] cyclically.
		k := t.home(s.hash)
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			t.slots[i] = s
			i = j
		}
	}
	t.slots[i] = slot{}
}

// grow doubles the table.
func (t *table) grow() {
	old := t.slots
	t.slots = make([]slot, 2*len(old))
	t.mask = uint64(len(t.slots) - 1)
	t.shift--
	t.n = 0
	for _, s := range old {
		if s.nd.count != 0 {
			t.put(s.hash, s.nd)
		}
	}
}

package tokenizer

import (
	"hash/maphash"
	"sync"
)

// memo maps text (a pre-token or a segment between added tokens) to its
// token ids. It keeps every key's bytes and every entry's ids in two
// arenas and indexes them by a 64-bit hash of the text, so its map holds
// no pointers: the garbage collector never scans its entries. It is
// bounded: when either limit is reached it starts over empty. It is safe
// for concurrent use.
type memo struct {
	mu       sync.Mutex
	seed     maphash.Seed
	index    map[uint64]memoEntry
	text     []byte   // keys' bytes, append-only until reset
	ids      []uint32 // entries' ids, append-only until reset
	maxItems int      // entries
	maxText  int      // bytes of keys
}

// memoEntry locates one entry's key in memo.text and its ids in memo.ids.
type memoEntry struct {
	textOff, textLen uint32
	idsOff, idsLen   uint32
}

func newMemo(maxItems, maxText int) *memo {
	return &memo{
		seed:     maphash.MakeSeed(),
		index:    make(map[uint64]memoEntry),
		maxItems: maxItems,
		maxText:  maxText,
	}
}

// get returns the ids memoised for s. The slice is shared and read-only:
// the arenas are append-only and a reset allocates new ones, so it stays
// valid after the lock is released.
func (m *memo) get(s string) ([]uint32, bool) {
	h := maphash.String(m.seed, s)
	m.mu.Lock()
	e, ok := m.index[h]
	if !ok || int(e.textLen) != len(s) || string(m.text[e.textOff:e.textOff+e.textLen]) != s {
		m.mu.Unlock()
		return nil, false
	}
	ids := m.ids[e.idsOff : e.idsOff+e.idsLen : e.idsOff+e.idsLen]
	m.mu.Unlock()
	return ids, true
}

// put memoises ids for s (copying both). On a hash collision the older
// entry is replaced.
func (m *memo) put(s string, ids []uint32) {
	if len(s) > m.maxText {
		return
	}
	h := maphash.String(m.seed, s)
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.index) >= m.maxItems || len(m.text)+len(s) > m.maxText ||
		len(m.ids)+len(ids) > 1<<31 {
		// Start over. New arenas, never the old ones cleared: slices
		// returned by get may still be read.
		clear(m.index)
		m.text, m.ids = nil, nil
	}
	e := memoEntry{
		textOff: uint32(len(m.text)), textLen: uint32(len(s)),
		idsOff: uint32(len(m.ids)), idsLen: uint32(len(ids)),
	}
	m.text = append(m.text, s...)
	m.ids = append(m.ids, ids...)
	m.index[h] = e
}

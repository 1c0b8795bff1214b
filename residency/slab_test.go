package residency

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvrouter/kvrouter/prefix"
)

// model is the Index by definition: per replica a list of blocks, most
// recently touched first, their stamps and hold counts.
type model struct {
	cfg     Config
	max     int
	live    []bool
	cap     []int
	lru     [][]prefix.Hash
	touched []map[prefix.Hash]time.Duration
	held    []map[prefix.Hash]int
	total   int
}

func newModel(cfg Config, maxEntries int) *model {
	m := &model{cfg: cfg, max: maxEntries}
	n := cfg.MaxReplicas
	m.live, m.cap, m.lru = make([]bool, n), make([]int, n), make([][]prefix.Hash, n)
	m.touched, m.held = make([]map[prefix.Hash]time.Duration, n), make([]map[prefix.Hash]int, n)
	for r := range n {
		m.touched[r], m.held[r] = map[prefix.Hash]time.Duration{}, map[prefix.Hash]int{}
	}
	return m
}

func (m *model) del(r int, h prefix.Hash) {
	if _, ok := m.touched[r][h]; !ok {
		return
	}
	m.lru[r] = slices.DeleteFunc(m.lru[r], func(g prefix.Hash) bool { return g == h })
	delete(m.touched[r], h)
	delete(m.held[r], h)
	m.total--
}

func (m *model) front(r int, h prefix.Hash, now time.Duration) {
	if m.held[r][h] > 0 {
		now = heldStamp
	}
	if _, ok := m.touched[r][h]; ok {
		m.lru[r] = slices.DeleteFunc(m.lru[r], func(g prefix.Hash) bool { return g == h })
	} else {
		m.total++
	}
	m.touched[r][h] = now
	m.lru[r] = slices.Insert(m.lru[r], 0, h)
}

func (m *model) evictTail(r int) { m.del(r, m.lru[r][len(m.lru[r])-1]) }

func (m *model) store(r int, hs []prefix.Hash, now time.Duration, hold bool) {
	if !m.live[r] {
		m.live[r], m.cap[r] = true, m.cfg.DefaultCapacity
	}
	for ttl := m.cfg.TTL; ttl > 0 && len(m.lru[r]) > 0 && now-m.touched[r][m.lru[r][len(m.lru[r])-1]] > ttl; {
		m.evictTail(r)
	}
	for i := len(hs) - 1; i >= 0; i-- {
		h := hs[i]
		if _, ok := m.touched[r][h]; !ok {
			for (len(m.lru[r]) >= m.cap[r] || m.total >= m.max) && len(m.lru[r]) > 0 {
				m.evictTail(r)
			}
			if m.total >= m.max {
				continue
			}
		}
		m.front(r, h, now)
		if hold {
			m.held[r][h]++
			m.touched[r][h] = heldStamp
		}
	}
}

func (m *model) release(r int, hs []prefix.Hash, now time.Duration) {
	for i := len(hs) - 1; i >= 0; i-- {
		h := hs[i]
		if _, ok := m.touched[r][h]; !ok {
			continue
		}
		if m.held[r][h] > 1 {
			m.held[r][h]--
			continue
		}
		delete(m.held[r], h)
		m.front(r, h, now)
	}
}

func (m *model) setCapacity(r, c int) {
	if c <= 0 {
		c = m.cfg.DefaultCapacity
	}
	m.cap[r] = c
	for len(m.lru[r]) > c {
		m.evictTail(r)
	}
}

func (m *model) clear(r int) {
	for len(m.lru[r]) > 0 {
		m.evictTail(r)
	}
}

// match is Match by definition, on replicas ids (the others hold nothing).
func (m *model) match(q []prefix.Hash, now time.Duration, ids, match []int, age []time.Duration) {
	for _, r := range ids {
		match[r], age[r] = 0, 0
		for k, h := range q {
			t, ok := m.touched[r][h]
			if !ok || m.cfg.TTL > 0 && now-t > m.cfg.TTL {
				break
			}
			match[r], age[r] = k+1, now-t
		}
	}
}

// TestIndexAgainstModel applies random writes (seeds logged) to an Index
// and to the model, on replica ids that fill every bit the entries keep
// them in, with blocks shared by enough replicas to turn hot, hashes that
// collide in the table, capacities and a limit on the entries small
// enough to evict all the time, and holds; after each step the replicas'
// lists, counts, matches and ages must agree.
func TestIndexAgainstModel(t *testing.T) {
	ids := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 63, 64, 65, 1000, 2047, 4095}
	for seed := range uint64(4) {
		t.Logf("seed %d", seed)
		rng := rand.New(rand.NewPCG(seed, 7))
		cfg := Config{MaxReplicas: MaxReplicasLimit, DefaultCapacity: 40}
		maxEntries := MaxEntries
		if seed%2 == 1 {
			cfg.TTL = 600
			maxEntries = 500
		}
		x := New(cfg)
		x.maxEntries = maxEntries
		m := newModel(x.Config(), maxEntries)
		keys := collidingKeys(x, 64)
		block := func() prefix.Hash {
			switch rng.IntN(4) {
			case 0:
				return keys[rng.IntN(len(keys))]
			case 1: // popular: turns hot
				return prefix.Hash(rng.IntN(10))
			}
			return prefix.Hash(rng.IntN(8)*1000 + rng.IntN(40))
		}
		match, age := make([]int, MaxReplicasLimit), make([]time.Duration, MaxReplicasLimit)
		wm, wa := make([]int, MaxReplicasLimit), make([]time.Duration, MaxReplicasLimit)
		for i := range 3000 {
			now := time.Duration(i)
			r := ids[rng.IntN(len(ids))]
			hs := make([]prefix.Hash, 1+rng.IntN(24))
			for k := range hs {
				hs[k] = block()
			}
			switch op := rng.IntN(40); {
			case op < 24:
				x.Touch(r, hs, now)
				m.store(r, hs, now, false)
			case op < 30:
				x.Hold(r, hs, now)
				m.store(r, hs, now, true)
			case op < 35:
				x.Release(r, hs, now)
				m.release(r, hs, now)
			case op < 37:
				x.Remove(r, hs)
				for _, h := range hs {
					m.del(r, h)
				}
			case op == 37:
				c := rng.IntN(60)
				x.SetCapacity(r, c)
				if m.live[r] {
					m.setCapacity(r, c)
				}
			case op == 38:
				x.Clear(r)
				m.clear(r)
			default:
				x.RemoveReplica(r)
				m.clear(r)
				m.live[r], m.cap[r] = false, 0
			}
			for _, r := range ids {
				if got, want := x.Hashes(r), m.lru[r]; !slices.Equal(got, want) {
					t.Fatalf("step %d, replica %d: blocks %v, want %v", i, r, got, want)
				}
			}
			if x.Len() != m.total {
				t.Fatalf("step %d: Len %d, want %d", i, x.Len(), m.total)
			}
			x.Match(hs, now, match, age)
			m.match(hs, now, ids, wm, wa)
			if !slices.Equal(wm, match) || !slices.Equal(wa, age) {
				t.Fatalf("step %d: match (-want +got):\n%s\nage (-want +got):\n%s", i, cmp.Diff(wm, match), cmp.Diff(wa, age))
			}
			if i%100 == 0 {
				checkHolders(t, x)
				checkHeld(t, x, m, ids)
			}
		}
		if len(x.hots) == 0 {
			t.Errorf("seed %d: no block turned hot", seed)
		}
	}
}

// checkHeld checks the index's hold counts against the model's: one per
// held entry, none left over from entries gone.
func checkHeld(t *testing.T, x *Index, m *model, ids []int) {
	t.Helper()
	n := 0
	for _, r := range ids {
		for h, c := range m.held[r] {
			if got := x.heldCount(x.findLocked(r, h)); got != int32(c) {
				t.Fatalf("replica %d block %d: held %d, want %d", r, h, got, c)
			}
			n++
		}
	}
	if len(x.held) != n {
		t.Fatalf("%d hold counts kept, want %d", len(x.held), n)
	}
}

// collidingKeys returns n hashes of one home slot in x's table as it is
// now, half of them sharing a tag too, so that their probes pass over
// each other and compare keys.
func collidingKeys(x *Index, n int) []prefix.Hash {
	var out []prefix.Hash
	home := x.nodes.home(1 << 60)
	tag := tagOf(1 << 60)
	for h := prefix.Hash(1 << 60); len(out) < n; h++ {
		if x.nodes.home(h) != home {
			continue
		}
		if len(out) < n/2 && tagOf(h) != tag {
			continue
		}
		out = append(out, h)
	}
	return out
}

// TestTableCollisions inserts hashes of one home slot (and tag), deletes
// them in another order and checks after each step that every key left
// is found in its probe run and every key deleted is not.
func TestTableCollisions(t *testing.T) {
	x := New(Config{MaxReplicas: 4})
	keys := collidingKeys(x, 40)
	rng := rand.New(rand.NewPCG(3, 3))
	for i, h := range keys {
		x.Touch(i%4, []prefix.Hash{h}, time.Duration(i))
	}
	if x.nodes.n != len(keys) {
		t.Fatalf("%d keys in the table, want %d", x.nodes.n, len(keys))
	}
	checkHolders(t, x)
	order := rng.Perm(len(keys))
	for k, j := range order {
		x.Remove(j%4, []prefix.Hash{keys[j]})
		checkHolders(t, x)
		for _, o := range order[:k+1] {
			if _, ok := x.slotOf(keys[o]); ok {
				t.Fatalf("key %d found after its removal", keys[o])
			}
		}
	}
	if x.nodes.n != 0 || x.Len() != 0 {
		t.Errorf("after removing every key: %d slots used, %d entries", x.nodes.n, x.Len())
	}
}

// TestSlabGrowth fills an index past its first chunk and several table
// growths, empties it and fills it again: the freed entries are reused
// (the slab does not grow), and every block stays found.
func TestSlabGrowth(t *testing.T) {
	const n = chunkLen + chunkLen/2
	x := New(Config{MaxReplicas: 3, DefaultCapacity: n})
	hs := mixed(0, n)
	x.Touch(2, hs, 1)
	if len(x.chunks) != 2 || len(x.nodes.slots) < n {
		t.Fatalf("%d chunks, %d slots for %d entries", len(x.chunks), len(x.nodes.slots), n)
	}
	for _, k := range []int{0, chunkLen - 1, chunkLen, n - 1} {
		if !x.Has(2, hs[k]) || x.Has(1, hs[k]) {
			t.Fatalf("block %d: held by 2 %v, by 1 %v", k, x.Has(2, hs[k]), x.Has(1, hs[k]))
		}
	}
	x.RemoveReplica(2)
	if x.Len() != 0 || x.nodes.n != 0 {
		t.Fatalf("after RemoveReplica: %d entries, %d slots used", x.Len(), x.nodes.n)
	}
	x.Touch(1, mixed(n, n), 2)
	if len(x.chunks) != 2 || len(x.chunks[1]) != n-chunkLen {
		t.Errorf("refilled: %d chunks, the last %d long; want the freed entries reused", len(x.chunks), len(x.chunks[1]))
	}
	checkHolders(t, x)
}

// TestMaxEntries: an index at its limit makes room for a replica's new
// block from that replica's own oldest, and gives a replica holding none
// nothing.
func TestMaxEntries(t *testing.T) {
	x := New(Config{MaxReplicas: 3})
	x.maxEntries = 4
	x.Touch(0, chain(0, 3), 1)
	x.Touch(1, chain(10, 3), 2) // one fits; then 1 evicts its own
	if got := x.Hashes(1); !slices.Equal(got, chain(10, 1)) {
		t.Errorf("replica 1 holds %v, want its first block only", got)
	}
	x.Touch(2, chain(20, 2), 3)
	if x.Blocks(2) != 0 || x.Len() != 4 {
		t.Errorf("replica 2 holds %d, index %d; want 0 and 4", x.Blocks(2), x.Len())
	}
	x.Hold(2, chain(20, 1), 4) // nothing to hold: no count left behind
	if len(x.held) != 0 {
		t.Errorf("%d hold counts for entries never made", len(x.held))
	}
}

// TestEntryReplicaBits: the replica's id, kept in the spare bits of an
// entry's links, survives linking and unlinking for every id.
func TestEntryReplicaBits(t *testing.T) {
	var en entry
	for r := range int32(MaxReplicasLimit) {
		en.setReplica(r)
		en.setPrev(idMask - 2)
		en.setNext(-1)
		if en.replica() != r || en.prev() != idMask-2 || en.next() != -1 {
			t.Fatalf("replica %d: got replica %d prev %d next %d", r, en.replica(), en.prev(), en.next())
		}
		en.setPrev(int32(r))
		en.setNext(0)
		if en.replica() != r || en.prev() != r || en.next() != 0 {
			t.Fatalf("replica %d relinked: got replica %d prev %d next %d", r, en.replica(), en.prev(), en.next())
		}
	}
}

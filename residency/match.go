package residency

import (
	"math/bits"
	"time"

	"kvrouter/prefix"
)

// lookahead is how many block hashes Match looks up before walking them, so
// that their table probes (cache misses in a large index) overlap.
const lookahead = 32

// Match fills, for every replica r < len(match), match[r] with the number of
// leading blocks of hashes that r holds (its run stops at its first missing
// or expired block) and, when age is not nil, age[r] with how long ago r's
// deepest matched block was touched (zero when match[r] is zero). age must be
// nil or as long as match. It returns the longest run. It walks the hashes
// once and stops as soon as no replica continues; it does not allocate.
//
// The walk keeps the set of replicas still matching (alive) as a bitset and
// crosses it with each block's holders; a block whose holders include every
// alive replica (a shared prefix) costs a few word operations, and only the
// replicas that drop out are written to match and age.
func (x *Index) Match(hashes []prefix.Hash, now time.Duration, match []int, age []time.Duration) int {
	clear(match)
	if age != nil {
		age = age[:len(match)]
		clear(age)
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	w := x.words
	var aliveArr, nextArr [MaxReplicasLimit / 64]uint64
	alive, next := aliveArr[:w], nextArr[:w]
	m := matcher{x: x, now: now, match: match, age: age, prev: node{head: -1}}
	var nodes [lookahead]node
	i := 0
	for i < len(hashes) {
		// Look a batch up first, up to its first miss.
		n := 0
		for _, h := range hashes[i:min(i+lookahead, len(hashes))] {
			nd, ok := x.nodes.get(h)
			if !ok {
				break
			}
			nodes[n] = nd
			n++
		}
		for _, nd := range nodes[:n] {
			var changed bool
			if nd.count < 0 {
				changed = m.crossHot(&x.hots[-nd.count-1], alive, next, i == 0)
			} else {
				changed = m.crossCold(nd, alive, next, i == 0)
			}
			if changed {
				if i > 0 {
					m.drop(alive, next, i)
				}
				alive, next = next, alive
				if empty(alive) {
					return m.longest
				}
			}
			m.prev = nd
			i++
		}
		if n < lookahead {
			break
		}
	}
	if i > 0 {
		clear(next)
		m.drop(alive, next, i)
	}
	return m.longest
}

// matcher carries one Match walk's state.
type matcher struct {
	x       *Index
	now     time.Duration
	match   []int
	age     []time.Duration // holds raw touch times until a replica drops
	prev    node            // the node of the previous block
	longest int
}

// crossHot sets next to the holders of hb that are alive (all holders on
// the first block), leaving out expired ones. It reports whether next
// differs from alive; when it does not, next is garbage.
func (m *matcher) crossHot(hb *hot, alive, next []uint64, first bool) bool {
	if first {
		copy(next, hb.bits)
	} else {
		var diff uint64
		for j, a := range alive {
			n := a & hb.bits[j]
			diff |= n ^ a
			next[j] = n
		}
		if diff == 0 && !m.expired(hb) {
			return false
		}
	}
	if m.expired(hb) {
		ttl := m.x.cfg.TTL
		k := 0
		for j, b := range hb.bits {
			for b != 0 {
				t := bits.TrailingZeros64(b)
				b &= b - 1
				if m.now-hb.touched[k] > ttl {
					next[j] &^= 1 << t
				}
				k++
			}
		}
	}
	return true
}

// expired reports whether some holder of hb may have expired.
func (m *matcher) expired(hb *hot) bool {
	ttl := m.x.cfg.TTL
	return ttl > 0 && m.now-hb.oldest > ttl
}

// crossCold sets next to the holders of a cold node that are alive, and
// records their touch times in age. It reports whether next differs from
// alive.
func (m *matcher) crossCold(nd node, alive, next []uint64, first bool) bool {
	clear(next)
	ttl := m.x.cfg.TTL
	for e := nd.head; e >= 0; {
		en := m.x.entry(e)
		e = en.nextSame
		r := int(en.replica)
		if ttl > 0 && m.now-en.touched > ttl {
			continue
		}
		if !first && alive[r>>6]&(1<<(r&63)) == 0 {
			continue
		}
		next[r>>6] |= 1 << (r & 63)
		if m.age != nil && r < len(m.age) {
			m.age[r] = en.touched
		}
	}
	if first {
		return true
	}
	var diff uint64
	for j, a := range alive {
		diff |= a ^ next[j]
	}
	return diff != 0
}

// drop ends the runs of the replicas alive before block i and not after it:
// they hold blocks 0..i-1. Their age comes from the previous block.
func (m *matcher) drop(alive, next []uint64, i int) {
	m.longest = max(m.longest, i)
	if m.prev.count < 0 && m.age != nil {
		m.dropHot(&m.x.hots[-m.prev.count-1], alive, next, i)
		return
	}
	for j, a := range alive {
		d := a &^ next[j]
		for d != 0 {
			r := j<<6 | bits.TrailingZeros64(d)
			d &= d - 1
			if r >= len(m.match) {
				break
			}
			m.match[r] = i
			if m.age != nil {
				m.age[r] = m.now - m.age[r]
			}
		}
	}
}

// dropHot is drop after a hot block: the ages come from hb, by rank.
func (m *matcher) dropHot(hb *hot, alive, next []uint64, i int) {
	match, age, touched := m.match, m.age, hb.touched
	k := 0 // rank of the first holder in word j
	for j, a := range alive {
		held := hb.bits[j]
		d := a &^ next[j]
		if d == 0 {
			k += bits.OnesCount64(held)
			continue
		}
		base := j << 6
		if base >= len(match) {
			return
		}
		if n := len(match) - base; n < 64 {
			d &= 1<<n - 1
		}
		if d == held { // every holder of the word drops: ranks run on
			for ; d != 0; k++ {
				r := base | bits.TrailingZeros64(d)
				d &= d - 1
				match[r] = i
				age[r] = m.now - touched[k]
			}
			continue
		}
		for d != 0 {
			t := bits.TrailingZeros64(d)
			d &= d - 1
			r := base | t
			match[r] = i
			age[r] = m.now - touched[k+bits.OnesCount64(held&(1<<t-1))]
		}
		k += bits.OnesCount64(held)
	}
}

// empty reports whether no bit is set.
func empty(b []uint64) bool {
	for _, w := range b {
		if w != 0 {
			return false
		}
	}
	return true
}

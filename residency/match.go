package residency

import (
	"math/bits"
	"time"

	"kvrouter/prefix"
)

// Match fills, for every replica r < len(match), match[r] with the number of
// leading blocks of hashes that r holds (its run stops at its first missing
// or expired block) and, when age is not nil, age[r] with how long ago r's
// deepest matched block was touched (zero when match[r] is zero). age must be
// nil or as long as match. It returns the longest run. It walks the hashes
// once and stops as soon as no replica continues; it does not allocate.
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
	i := 0
	for ; i < len(hashes); i++ {
		nd, ok := x.nodes.get(hashes[i])
		if !ok {
			break
		}
		clear(next)
		if nd.count < 0 {
			m.crossHot(&x.hots[-nd.count-1], alive, next, i == 0)
		} else {
			m.crossCold(nd, alive, next, i == 0)
		}
		if i > 0 {
			m.drop(alive, next, i)
		}
		alive, next = next, alive
		m.prev = nd
		if empty(alive) {
			return m.longest
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
// the first block), leaving out expired ones.
func (m *matcher) crossHot(hb *hot, alive, next []uint64, first bool) {
	if first {
		copy(next, hb.bits)
	} else {
		for j := range next {
			next[j] = alive[j] & hb.bits[j]
		}
	}
	ttl := m.x.cfg.TTL
	if ttl <= 0 || m.now-hb.oldest <= ttl {
		return
	}
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

// crossCold sets next to the holders of a cold node that are alive, and
// records their touch times in age.
func (m *matcher) crossCold(nd node, alive, next []uint64, first bool) {
	ttl := m.x.cfg.TTL
	for e := nd.head; e >= 0; {
		en := &m.x.entries[e]
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
}

// drop ends the runs of the replicas alive before block i and not after it:
// they hold blocks 0..i-1. Their age comes from the previous block.
func (m *matcher) drop(alive, next []uint64, i int) {
	var hb *hot
	if m.prev.count < 0 {
		hb = &m.x.hots[-m.prev.count-1]
	}
	base := 0
	for j := range alive {
		d := alive[j] &^ next[j]
		for d != 0 {
			t := bits.TrailingZeros64(d)
			d &= d - 1
			r := j<<6 | t
			if r >= len(m.match) {
				continue
			}
			m.match[r] = i
			if m.age == nil {
				continue
			}
			if hb != nil {
				k := base + bits.OnesCount64(hb.bits[j]&(1<<t-1))
				m.age[r] = m.now - hb.touched[k]
			} else {
				m.age[r] = m.now - m.age[r]
			}
		}
		if hb != nil {
			base += bits.OnesCount64(hb.bits[j])
		}
	}
	m.longest = max(m.longest, i)
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

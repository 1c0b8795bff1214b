package residency

import (
	"math/bits"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
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
// alive replica (a shared prefix) is only read, a few word operations for a
// hot block and one bit test per holder for a cold one. Match and age are
// written when replicas drop out, from the previous block's holders: after
// a hot block whole bitset words at a time (a plain loop over 64 replicas),
// after a cold one by looking the replica up in the block's short run.
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
			nd, ok := x.getNode(h)
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
	age     []time.Duration
	prev    node // the node of the previous block
	alive   int  // replicas in the alive set
	longest int
}

// crossHot sets next to the holders of hb that are alive (all holders on
// the first block), leaving out expired ones. It reports whether next
// differs from alive; when it does not, next is garbage.
func (m *matcher) crossHot(hb *hot, alive, next []uint64, first bool) bool {
	if first {
		copy(next, hb.bits)
	} else {
		held := hb.bits[:len(alive)]
		var diff uint64
		for j, a := range alive { // reading only: most blocks keep everyone
			diff |= a &^ held[j]
		}
		if diff == 0 && !m.expired(hb) {
			return false
		}
		next = next[:len(alive)]
		for j, a := range alive {
			next[j] = a & held[j]
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
	m.count(next)
	return true
}

// count sets m.alive to the members of next.
func (m *matcher) count(next []uint64) {
	n := 0
	for _, b := range next {
		n += bits.OnesCount64(b)
	}
	m.alive = n
}

// expired reports whether some holder of hb may have expired.
func (m *matcher) expired(hb *hot) bool {
	ttl := m.x.cfg.TTL
	return ttl > 0 && m.now-hb.oldest > ttl
}

// crossCold sets next to the holders of a cold node that are alive (all of
// them on the first block), leaving out expired ones. It reports whether
// next differs from alive; when it does not, next is garbage. It reads the
// node's run of holders and, only with a TTL, their entries.
func (m *matcher) crossCold(nd node, alive, next []uint64, first bool) bool {
	ttl := m.x.cfg.TTL
	one := [1]holder{{entry: nd.head}}
	hs := one[:]
	if nd.count > 1 {
		hs = m.x.run(nd)
	} else {
		one[0].replica = m.x.entry(nd.head).replica()
	}
	if !first {
		// Count the alive holders first, reading only: a node that keeps
		// every alive replica (a shared prefix) needs no next.
		kept := 0
		for _, h := range hs {
			r := int(h.replica)
			if alive[r>>6]&(1<<(r&63)) != 0 && (ttl <= 0 || m.now-m.x.entry(h.entry).touched <= ttl) {
				kept++
			}
		}
		if kept == m.alive {
			return false
		}
	}
	clear(next)
	kept := 0
	for _, h := range hs {
		r := int(h.replica)
		if !first && alive[r>>6]&(1<<(r&63)) == 0 {
			continue
		}
		if ttl > 0 && m.now-m.x.entry(h.entry).touched > ttl {
			continue
		}
		next[r>>6] |= 1 << (r & 63)
		kept++
	}
	m.alive = kept
	return true
}

// drop ends the runs of the replicas alive before block i and not after it:
// they hold blocks 0..i-1. Their age comes from the previous block.
func (m *matcher) drop(alive, next []uint64, i int) {
	m.longest = max(m.longest, i)
	if m.prev.count < 0 {
		if m.age == nil {
			m.dropAll(alive, next, i)
			return
		}
		m.dropHot(&m.x.hots[-m.prev.count-1], alive, next, i)
		return
	}
	if m.age == nil {
		m.dropAll(alive, next, i)
		return
	}
	// The previous block is cold: each dropped replica's entry is in its
	// run (or is its only holder).
	one := [1]holder{{entry: m.prev.head}}
	hs := one[:]
	if m.prev.count > 1 {
		hs = m.x.run(m.prev)
	} else if m.prev.count == 1 {
		one[0].replica = m.x.entry(m.prev.head).replica()
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
			if m.age == nil {
				continue
			}
			for _, h := range hs {
				if int(h.replica) == r {
					m.age[r] = m.now - m.x.entry(h.entry).touched
					break
				}
			}
		}
	}
}

// dropAll is drop without ages.
func (m *matcher) dropAll(alive, next []uint64, i int) {
	for j, a := range alive {
		d := a &^ next[j]
		for d != 0 {
			r := j<<6 | bits.TrailingZeros64(d)
			d &= d - 1
			if r >= len(m.match) {
				return
			}
			m.match[r] = i
		}
	}
}

// dropHot is drop after a hot block: the ages come from hb, by rank.
//
// A word whose holders are all alive is written whole, in rank order,
// survivors included: a survivor is written again when it drops, and
// nothing else writes match or age in between. After a shared prefix that
// is almost every word, and a full one is a plain loop.
func (m *matcher) dropHot(hb *hot, alive, next []uint64, i int) {
	match, age, touched := m.match, m.age, hb.touched
	k := 0 // rank of the first holder in word j
	for j := 0; j < len(alive); j++ {
		a := alive[j]
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
		n := len(match) - base
		switch {
		case a == ^uint64(0) && n >= 64: // alive ⊆ held: 64 holders in a row
			// and as many more full words as follow.
			end := j + 1
			for end < len(alive) && alive[end] == ^uint64(0) && len(match)-end<<6 >= 64 {
				end++
			}
			w := (end - j) << 6
			fillRun(match[base:base+w], age[base:base+w], touched[k:k+w], i, m.now)
			k += w
			j = end - 1
			continue
		case a == held:
			if n < 64 {
				a &= 1<<n - 1
			}
			for q := k; a != 0; q++ {
				r := base | bits.TrailingZeros64(a)
				a &= a - 1
				match[r] = i
				age[r] = m.now - touched[q]
			}
		default:
			if n < 64 {
				d &= 1<<n - 1
			}
			for d != 0 {
				t := bits.TrailingZeros64(d)
				d &= d - 1
				match[base|t] = i
				age[base|t] = m.now - touched[k+bits.OnesCount64(held&(1<<t-1))]
			}
		}
		k += bits.OnesCount64(held)
	}
}

// fillRun sets match to i and age to now minus touched, element by element:
// the dense case of dropHot, kept out of line so that its loop has the
// registers to itself.
//
//go:noinline
func fillRun(match []int, age, touched []time.Duration, i int, now time.Duration) {
	age, touched = age[:len(match)], touched[:len(match)]
	for t := range match {
		match[t] = i
		age[t] = now - touched[t]
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

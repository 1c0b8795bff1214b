package residency

import (
	"time"

	"github.com/kvrouter/kvrouter/prefix"
)

// Fresh returns, of the first match blocks of hashes that replica r holds
// (as Match found them), how many it touched within the last within, and
// how long ago it touched the deepest of those (0 and 0 when none). A touch
// stamps every block of a chain at once, so along a chain a replica's ages
// never decrease with depth: a shared prefix (a system prompt, a group's
// context) is as young as the last request that shared it, a
// conversation's own turns as old as its last turn. Fresh finds where
// the age crosses within by bisection, in about log₂(match) lookups.
func (x *Index) Fresh(r int, hashes []prefix.Hash, match int, within, now time.Duration) (int, time.Duration) {
	match = min(match, len(hashes))
	if !x.valid(r) || match <= 0 {
		return 0, 0
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	age := func(i int) (time.Duration, bool) {
		e := x.findLocked(r, hashes[i])
		if e < 0 {
			return 0, false
		}
		return now - x.entry(e).touched, true
	}
	a, ok := age(0)
	if !ok || a > within {
		return 0, 0
	}
	// Invariant: block lo is fresh (age a); blocks from hi on are not.
	lo, hi := 0, match
	for hi-lo > 1 {
		mid := int(uint(lo+hi) / 2)
		if m, ok := age(mid); ok && m <= within {
			lo, a = mid, m
		} else {
			hi = mid
		}
	}
	return lo + 1, a
}

package residency

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
)

// TestFresh: a conversation's replica was last asked for the whole chain
// (a 6-block shared context and its own 6 turns) at 10; other requests
// sharing the context touched its first 6 blocks at 90, and its first 3
// at 95. At 100, within 20 the fresh part is the 6 shared blocks, age 10;
// within 8, the first 3, age 5; within 4 none. The bisection agrees with
// a walk block by block whatever the split, and a replica not holding the
// first block, or a match of 0, has no fresh part.
func TestFresh(t *testing.T) {
	x := New(Config{MaxReplicas: 3})
	whole := chain(0, 12)
	x.Touch(0, whole, 10)
	x.Touch(0, chain(0, 6), 90)
	x.Touch(0, chain(0, 3), 95)
	for _, tc := range []struct {
		within  time.Duration
		wantN   int
		wantAge time.Duration
		replica int
		match   int
		hashes  []prefix.Hash
	}{
		{20, 6, 10, 0, 12, whole},
		{8, 3, 5, 0, 12, whole},
		{4, 0, 0, 0, 12, whole},
		{100, 12, 90, 0, 12, whole},
		{100, 5, 10, 0, 5, whole}, // at most the match
		{20, 0, 0, 1, 12, whole},  // replica 1 holds nothing
		{20, 0, 0, 0, 0, whole},
		{20, 0, 0, 0, 12, chain(50, 12)},
	} {
		n, age := x.Fresh(tc.replica, tc.hashes, tc.match, tc.within, 100)
		if n != tc.wantN || age != tc.wantAge {
			t.Errorf("Fresh(replica %d, match %d, within %v) = %d blocks, age %v; want %d, %v",
				tc.replica, tc.match, tc.within, n, age, tc.wantN, tc.wantAge)
		}
	}
	// Every split point of a 40-block chain.
	for split := 0; split <= 40; split++ {
		y := New(Config{MaxReplicas: 1})
		y.Touch(0, chain(0, 40), 0)
		if split > 0 {
			y.Touch(0, chain(0, split), 50)
		}
		if n, _ := y.Fresh(0, chain(0, 40), 40, 60, 100); n != split {
			t.Errorf("split %d: Fresh found %d", split, n)
		}
	}
}

package residency

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvrouter/kvrouter/prefix"
)

// chain returns hashes base+0 .. base+n-1, standing for a chain of n blocks.
func chain(base, n int) []prefix.Hash {
	out := make([]prefix.Hash, n)
	for i := range out {
		out[i] = prefix.Hash(base + i)
	}
	return out
}

type touch struct {
	r      int
	hashes []prefix.Hash
	at     time.Duration
}

func TestMatch(t *testing.T) {
	tests := []struct {
		name      string
		cfg       Config
		caps      []int
		touches   []touch
		query     []prefix.Hash
		now       time.Duration
		wantMatch []int
		wantAge   []time.Duration
	}{
		{"empty index", Config{MaxReplicas: 3}, nil, nil, chain(0, 4), 0, []int{0, 0, 0}, []time.Duration{0, 0, 0}},
		{"longest prefix per replica", Config{MaxReplicas: 3}, nil,
			[]touch{{0, chain(0, 4), 1}, {1, chain(0, 2), 2}, {2, chain(100, 4), 3}},
			chain(0, 6), 10, []int{4, 2, 0}, []time.Duration{9, 8, 0}},
		{"run stops at first missing block", Config{MaxReplicas: 2}, nil,
			[]touch{{0, chain(0, 2), 1}, {0, chain(3, 3), 1}},
			chain(0, 6), 1, []int{2, 0}, []time.Duration{0, 0}},
		{"age of the deepest matched block", Config{MaxReplicas: 1}, nil,
			[]touch{{0, chain(0, 4), 1}, {0, chain(0, 2), 5}},
			chain(0, 4), 7, []int{4}, []time.Duration{6}},
		{"LRU eviction at capacity drops the chain tail first", Config{MaxReplicas: 1}, []int{3},
			[]touch{{0, chain(0, 4), 1}},
			chain(0, 4), 1, []int{3}, []time.Duration{0}},
		{"LRU evicts the least recent chain", Config{MaxReplicas: 1}, []int{4},
			[]touch{{0, chain(0, 2), 1}, {0, chain(10, 2), 2}, {0, chain(0, 2), 3}, {0, chain(20, 2), 4}},
			chain(0, 2), 5, []int{2}, []time.Duration{2}},
		{"TTL hides old entries", Config{MaxReplicas: 2, TTL: 10}, nil,
			[]touch{{0, chain(0, 4), 0}, {1, chain(0, 4), 5}},
			chain(0, 4), 12, []int{0, 4}, []time.Duration{0, 7}},
		{"TTL cuts a run at its first expired block", Config{MaxReplicas: 1, TTL: 10}, nil,
			[]touch{{0, chain(0, 4), 0}, {0, chain(0, 2), 8}},
			chain(0, 4), 12, []int{2}, []time.Duration{4}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x := New(tc.cfg)
			for r, c := range tc.caps {
				if err := x.AddReplica(r, c); err != nil {
					t.Fatal(err)
				}
			}
			for _, tt := range tc.touches {
				x.Touch(tt.r, tt.hashes, tt.at)
			}
			match := make([]int, len(tc.wantMatch))
			age := make([]time.Duration, len(tc.wantMatch))
			x.Match(tc.query, tc.now, match, age)
			if diff := cmp.Diff(tc.wantMatch, match); diff != "" {
				t.Errorf("match (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantAge, age); diff != "" {
				t.Errorf("age (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMatchHot covers blocks held by enough replicas to get a bitset,
// against the same index built with every block cold.
func TestMatchHot(t *testing.T) {
	const n = 40
	x := New(Config{MaxReplicas: 100, TTL: 50})
	for r := range n {
		x.Touch(r, chain(0, 8), time.Duration(r))       // hot prefix, on all
		x.Touch(r, chain(0, 8+r%5), time.Duration(r+1)) // runs of 8..12
	}
	if len(x.hots) == 0 {
		t.Fatal("no block became hot")
	}
	match := make([]int, 100)
	age := make([]time.Duration, 100)
	longest := x.Match(chain(0, 20), 45, match, age)
	if longest != 12 {
		t.Errorf("longest %d, want 12", longest)
	}
	for r := range 100 {
		want, wantAge := 0, time.Duration(0)
		if r < n {
			want = 8 + r%5
			wantAge = time.Duration(45 - (r + 1))
			if r%5 == 0 {
				wantAge = time.Duration(45 - (r + 1)) // refreshed by the second touch too
			}
		}
		if match[r] != want || age[r] != wantAge {
			t.Errorf("replica %d: match %d age %v, want %d %v", r, match[r], age[r], want, wantAge)
		}
	}
	// At now=60 replicas 0..9 touched at <= 10 are expired.
	x.Match(chain(0, 20), 60, match, age)
	for r := range n {
		want := 8 + r%5
		if r+1 < 10 {
			want = 0
		}
		if match[r] != want {
			t.Errorf("after TTL replica %d: match %d, want %d", r, match[r], want)
		}
	}
	// Removing replicas demotes the hot blocks and keeps the rest right.
	for r := 10; r < n; r++ {
		x.RemoveReplica(r)
	}
	x.Match(chain(0, 20), 9, match, age)
	for r := range 10 {
		if match[r] != 8+r%5 {
			t.Errorf("after removal replica %d: match %d, want %d", r, match[r], 8+r%5)
		}
	}
	if match[10] != 0 || x.Blocks(10) != 0 {
		t.Errorf("removed replica 10 still matches %d, holds %d", match[10], x.Blocks(10))
	}
}

func TestPrecise(t *testing.T) {
	x := New(Config{MaxReplicas: 2})
	x.Store(0, chain(0, 5), 1)
	x.Store(1, chain(0, 3), 1)
	x.Remove(0, chain(2, 1))
	x.Remove(0, chain(99, 1)) // not held: ignored
	match := make([]int, 2)
	x.Match(chain(0, 5), 2, match, nil)
	if diff := cmp.Diff([]int{2, 3}, match); diff != "" {
		t.Errorf("after Remove (-want +got):\n%s", diff)
	}
	if x.Has(0, 2) || !x.Has(0, 3) || x.Len() != 7 {
		t.Errorf("Has(0,2)=%v Has(0,3)=%v Len=%d, want false true 7", x.Has(0, 2), x.Has(0, 3), x.Len())
	}
	x.Clear(1)
	x.Match(chain(0, 5), 2, match, nil)
	if diff := cmp.Diff([]int{2, 0}, match); diff != "" {
		t.Errorf("after Clear (-want +got):\n%s", diff)
	}
	want := []prefix.Hash{0, 1, 3, 4}
	got := x.Hashes(0)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Hashes(0) (-want +got):\n%s", diff)
	}
}

func TestCapacityAndExpire(t *testing.T) {
	x := New(Config{MaxReplicas: 2, TTL: 10})
	if err := x.AddReplica(5, 1); err == nil {
		t.Error("AddReplica out of range: no error")
	}
	x.AddReplica(0, 10)
	x.Touch(0, chain(0, 8), 0)
	x.SetCapacity(0, 3)
	if got := x.Hashes(0); !cmp.Equal(got, chain(0, 3)) {
		t.Errorf("after SetCapacity(3): %v, want the chain's first 3", got)
	}
	x.Touch(1, chain(50, 2), 5)
	x.Expire(12)
	if x.Blocks(0) != 0 || x.Blocks(1) != 2 || x.Len() != 2 {
		t.Errorf("after Expire: blocks %d %d len %d, want 0 2 2", x.Blocks(0), x.Blocks(1), x.Len())
	}
	x.Touch(-1, chain(0, 2), 0) // ignored, no panic
	x.Touch(7, chain(0, 2), 0)
	if x.Len() != 2 {
		t.Errorf("out-of-range touches changed the index: len %d", x.Len())
	}
}

// TestRandomTouchesRespectCapacity checks, after random touches (seed
// logged), that no replica exceeds its capacity, that the entry counts add
// up and that every replica's list agrees with Has.
func TestRandomTouchesRespectCapacity(t *testing.T) {
	const seed = 42
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	const reps = 40
	x := New(Config{MaxReplicas: reps, TTL: 400})
	caps := make([]int, reps)
	for r := range reps {
		caps[r] = 5 + rng.IntN(60)
		x.AddReplica(r, caps[r])
	}
	for i := range 5000 {
		r := rng.IntN(reps)
		// Prefixes share roots: 20 roots, chains up to 30 blocks.
		root := rng.IntN(20) * 1000
		x.Touch(r, chain(root, 1+rng.IntN(30)), time.Duration(i))
		if rng.IntN(50) == 0 {
			x.Remove(rng.IntN(reps), chain(root, 5))
		}
		if rng.IntN(500) == 0 {
			x.SetCapacity(r, 5+rng.IntN(60))
		}
	}
	sum := 0
	for r := range reps {
		hs := x.Hashes(r)
		if len(hs) > x.replicas[r].cap {
			t.Errorf("replica %d holds %d blocks, capacity %d", r, len(hs), x.replicas[r].cap)
		}
		for _, h := range hs {
			if !x.Has(r, h) {
				t.Errorf("replica %d lists %d but Has says no", r, h)
			}
		}
		sum += len(hs)
	}
	if sum != x.Len() {
		t.Errorf("sum of replica blocks %d != Len %d", sum, x.Len())
	}
	checkHolders(t, x)
	// Cross-check Match against Has, block by block.
	match := make([]int, reps)
	q := chain(3000, 30)
	x.Match(q, 5000, match, nil)
	for r := range reps {
		want := 0
		for want < len(q) && x.Has(r, q[want]) && 5000-x.entry(x.findLocked(r, q[want])).touched <= 400 {
			want++
		}
		if match[r] != want {
			t.Errorf("replica %d: match %d, want %d", r, match[r], want)
		}
	}
}

package residency

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"kvrouter/prefix"
)

// bruteMatch is Match by definition, one replica and one block at a time.
func bruteMatch(x *Index, q []prefix.Hash, now time.Duration, n int) ([]int, []time.Duration) {
	match := make([]int, n)
	age := make([]time.Duration, n)
	for r := range n {
		for k, h := range q {
			e := x.findLocked(r, h)
			if e < 0 || (x.cfg.TTL > 0 && now-x.entry(e).touched > x.cfg.TTL) {
				break
			}
			match[r] = k + 1
			age[r] = now - x.entry(e).touched
		}
	}
	return match, age
}

// TestMatchRandom checks Match against bruteMatch on random fleets (seeds
// logged) mixing hot and cold blocks, with and without a TTL, with match
// shorter than MaxReplicas, and with queries longer than one lookahead
// batch.
func TestMatchRandom(t *testing.T) {
	for seed := range uint64(6) {
		t.Logf("seed %d", seed)
		rng := rand.New(rand.NewPCG(seed, 1))
		const reps = 150
		cfg := Config{MaxReplicas: 200}
		if seed%2 == 1 {
			cfg.TTL = 3000
		}
		x := New(cfg)
		for r := range reps {
			x.AddReplica(r, 50+rng.IntN(400))
		}
		for i := range 20000 {
			r := rng.IntN(reps)
			if rng.IntN(3) == 0 {
				r %= 30 // a popular subset, so some chains become hot
			}
			root := rng.IntN(8) * 1000
			x.Touch(r, chain(root, 1+rng.IntN(80)), time.Duration(i))
			if rng.IntN(200) == 0 {
				x.Remove(rng.IntN(reps), chain(root+rng.IntN(40), 3))
			}
		}
		if len(x.hots) == 0 {
			t.Fatal("no hot block: the test does not cover the bitsets")
		}
		for q := range 40 {
			query := chain(rng.IntN(8)*1000, 1+rng.IntN(80))
			now := time.Duration(20000 + rng.IntN(2000))
			n := reps - q%3 // match shorter than the replicas, sometimes
			match := make([]int, n)
			age := make([]time.Duration, n)
			longest := x.Match(query, now, match, age)
			wantMatch, wantAge := bruteMatch(x, query, now, n)
			if diff := cmp.Diff(wantMatch, match); diff != "" {
				t.Fatalf("seed %d query %d: match (-want +got):\n%s", seed, q, diff)
			}
			if diff := cmp.Diff(wantAge, age); diff != "" {
				t.Fatalf("seed %d query %d: age (-want +got):\n%s", seed, q, diff)
			}
			want := 0
			for _, m := range wantMatch {
				want = max(want, m)
			}
			if longest < want || (n == reps && longest != want) {
				t.Fatalf("seed %d query %d: longest %d, want %d", seed, q, longest, want)
			}
			x.Match(query, now, match, nil) // without ages
			if diff := cmp.Diff(wantMatch, match); diff != "" {
				t.Fatalf("seed %d query %d, no age: match (-want +got):\n%s", seed, q, diff)
			}
		}
	}
}

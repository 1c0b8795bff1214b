package residency

import (
	"math/bits"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvrouter/kvrouter/prefix"
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
		checkHolders(t, x)
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

// TestMatchShared checks Match against bruteMatch on fleets shaped like
// production: a system prompt held by every replica (hot, full bitset
// words), tenant prompts held by groups of replicas, some replicas missing
// a block of the system prompt, touches at different times, with and without
// a TTL, and match cut at and between bitset words.
func TestMatchShared(t *testing.T) {
	tests := []struct {
		name string
		reps int
		ttl  time.Duration
		gaps bool // some replicas lose a block of the system prompt
	}{
		{name: "200 replicas", reps: 200},
		{name: "200 replicas, gaps", reps: 200, gaps: true},
		{name: "200 replicas, ttl", reps: 200, ttl: 250},
		{name: "256 replicas, gaps, ttl", reps: 256, ttl: 250, gaps: true},
		{name: "64 replicas", reps: 64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := New(Config{MaxReplicas: tt.reps, TTL: tt.ttl})
			system := chain(1<<20, 24)
			for r := range tt.reps {
				x.AddReplica(r, 500)
				tenant := chain(1<<21+(r%7)*1000, 24)
				x.Touch(r, append(append([]prefix.Hash(nil), system...), tenant...), time.Duration(r))
				if tt.gaps && r%37 == 5 {
					x.Remove(r, system[10+r%9:11+r%9])
				}
			}
			// Refresh some replicas later, so ages (and expiry) differ.
			for r := 0; r < tt.reps; r += 3 {
				x.Touch(r, system[:16], time.Duration(300+r))
			}
			checkHolders(t, x)
			for q, tenant := range []int{0, 3, 6} {
				query := append(append([]prefix.Hash(nil), system...), chain(1<<21+tenant*1000, 24)...)
				for _, n := range []int{tt.reps, tt.reps - 1, min(tt.reps, 128), min(tt.reps, 100), 63} {
					now := time.Duration(400 + q)
					match := make([]int, n)
					age := make([]time.Duration, n)
					x.Match(query, now, match, age)
					wantMatch, wantAge := bruteMatch(x, query, now, n)
					if diff := cmp.Diff(wantMatch, match); diff != "" {
						t.Fatalf("tenant %d, %d replicas: match (-want +got):\n%s", tenant, n, diff)
					}
					if diff := cmp.Diff(wantAge, age); diff != "" {
						t.Fatalf("tenant %d, %d replicas: age (-want +got):\n%s", tenant, n, diff)
					}
				}
			}
		})
	}
}

// checkHolders checks every node's holders against the entries: a single
// holder's entry, a run's entries and replicas, a hot set's bits and ranks,
// and that the holders add up to Len.
func checkHolders(t *testing.T, x *Index) {
	t.Helper()
	total := 0
	for i, ref := range x.nodes.slots {
		if ref == 0 {
			continue
		}
		s := struct{ hash prefix.Hash }{x.keyOf(ref)}
		dist := distBits((uint64(i) - x.nodes.home(s.hash)) & x.nodes.mask)
		if j, ok := x.slotOf(s.hash); !ok || j != uint64(i) || ref&tagMask != tagOf(s.hash) || ref&distMask != dist {
			t.Fatalf("slot %d (%#x): its key %d is found at %d, %v", i, ref, s.hash, j, ok)
		}
		nd, _ := x.getNode(s.hash)
		switch {
		case nd.count == 0:
			t.Fatalf("slot %d: node of no holder", i)
		case nd.count == 1:
			if ref&groupRef != 0 {
				t.Fatalf("node %d: one holder in a group", s.hash)
			}
			total++
		case nd.count > 1:
			if nd.count >= hotAt || int(nd.head)+runCap(int(nd.count)) > len(x.holders) {
				t.Fatalf("node %d: run at %d of %d holders out of bounds", s.hash, nd.head, nd.count)
			}
			seen := map[int32]bool{}
			for _, h := range x.run(nd) {
				en := x.entry(h.entry)
				if en.hash != s.hash || en.replica() != h.replica || seen[h.replica] {
					t.Fatalf("node %d: holder %+v has entry hash %d replica %d (seen %v)", s.hash, h, en.hash, en.replica(), seen[h.replica])
				}
				seen[h.replica] = true
			}
			total += int(nd.count)
		default:
			hb := &x.hots[-nd.count-1]
			k := 0
			for j, b := range hb.bits {
				for ; b != 0; b &= b - 1 {
					r := j<<6 | bits.TrailingZeros64(b)
					en := x.entry(hb.entries[k])
					if en.hash != s.hash || int(en.replica()) != r || en.touched != hb.touched[k] {
						t.Fatalf("hot node %d: rank %d replica %d has entry %+v", s.hash, k, r, *en)
					}
					k++
				}
			}
			if k != len(hb.entries) || k < coldAt {
				t.Fatalf("hot node %d: %d bits, %d entries", s.hash, k, len(hb.entries))
			}
			total += k
		}
	}
	if total != x.Len() {
		t.Fatalf("nodes hold %d entries, Len %d", total, x.Len())
	}
}

package route

import (
	"math"
	"testing"
	"time"
)

// rq is a request of tokens prompt tokens (16-token blocks) with per-replica
// matched blocks, unpinned.
func rq(tokens int, match ...int) *Request {
	return &Request{ID: "r", Hash: 7, Tokens: tokens, Blocks: tokens / 16, Match: match, Pinned: -1}
}

// up is a healthy replica with the given own in-flight count.
func up(id string, inFlight int) Replica { return Replica{ID: id, Healthy: true, InFlight: inFlight} }

// pickCase is one table row: a policy's pick over a literal snapshot.
type pickCase struct {
	name       string
	snap       Snapshot
	req        *Request
	want       int
	wantReason string // "" means not checked
}

// runPicks runs a table of cases against p.
func runPicks(t *testing.T, p Policy, cases []pickCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := p.Pick(tc.req, &tc.snap)
			if d.Replica != tc.want {
				t.Errorf("replica: got %d, want %d (reason %q)", d.Replica, tc.want, d.Reason)
			}
			if tc.wantReason != "" && d.Reason != tc.wantReason {
				t.Errorf("reason: got %q, want %q", d.Reason, tc.wantReason)
			}
		})
	}
}

// TestEveryPolicyEdgeCases checks, for every named policy: no replica, no
// healthy replica, a single healthy replica, determinism, and Costs
// aliasing.
func TestEveryPolicyEdgeCases(t *testing.T) {
	down := Snapshot{Replicas: []Replica{{ID: "a"}, {ID: "b"}}}
	single := Snapshot{Replicas: []Replica{{ID: "a"}, up("b", 3), {ID: "c"}}}
	busy := Snapshot{Replicas: []Replica{
		{ID: "a", Healthy: true, InFlight: 300, Running: 256, Waiting: 40, Scraped: true, KVUsage: 0.99, PrefillTokens: 50000, CacheBlocks: 1000, DecodeBlocks: 990},
		{ID: "b", Healthy: true, InFlight: 280, Running: 256, Waiting: 20, Scraped: true, KVUsage: 0.97, PrefillTokens: 40000, CacheBlocks: 1000, DecodeBlocks: 970},
		{ID: "c", Healthy: true, InFlight: 290, Running: 256, Waiting: 30, Scraped: true, KVUsage: 0.98, PrefillTokens: 45000, CacheBlocks: 1000, DecodeBlocks: 980},
	}}
	for _, name := range Names() {
		p, err := New(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(name, func(t *testing.T) {
			if d := p.Pick(rq(100), &Snapshot{}); d.Replica != -1 || d.Reason != ReasonNoHealthy {
				t.Errorf("empty: got %d %q, want -1 %q", d.Replica, d.Reason, ReasonNoHealthy)
			}
			if d := p.Pick(rq(100, 3, 3), &down); d.Replica != -1 || d.Reason != ReasonNoHealthy {
				t.Errorf("no healthy: got %d %q, want -1 %q", d.Replica, d.Reason, ReasonNoHealthy)
			}
			r := rq(100, 6, 0, 6)
			r.Session, r.PrefixKey = 5, 9
			if d := p.Pick(r, &single); d.Replica != 1 {
				t.Errorf("single healthy: got %d, want 1", d.Replica)
			}
			r = rq(1000, 10, 20, 30)
			r.Costs = make([]Cost, 0, 3)
			d1, d2 := p.Pick(r, &busy), p.Pick(r, &busy)
			if d1.Replica < 0 || d1.Replica != d2.Replica || d1.Reason != d2.Reason {
				t.Errorf("all saturated: got %d %q then %d %q, want one replica twice", d1.Replica, d1.Reason, d2.Replica, d2.Reason)
			}
			if len(d1.Costs) > 0 && &d1.Costs[0] != &r.Costs[:1][0] {
				t.Errorf("Decision.Costs does not alias Request.Costs")
			}
		})
	}
}

// TestPickAllocates nothing, for every policy, with costs recorded.
func TestPickAllocatesNothing(t *testing.T) {
	r, s := benchFleet(64)
	for _, name := range Names() {
		p, _ := New(name)
		if n := testing.AllocsPerRun(100, func() { r.Seq++; p.Pick(r, s) }); n != 0 {
			t.Errorf("%s: got %v allocs per Pick, want 0", name, n)
		}
	}
}

// TestTiesBrokenByHash: identical replicas; the same hash always picks the
// same replica, and different hashes spread over all of them.
func TestTiesBrokenByHash(t *testing.T) {
	snap := Snapshot{Replicas: []Replica{up("a", 1), up("b", 1), up("c", 1)}}
	for _, name := range []string{"least-loaded", "dynamo-kv", "llm-d", "mooncake", "kv-aware", "preble-e2", "sglang-cache-aware"} {
		p, _ := New(name)
		seen := map[int]bool{}
		for h := range uint64(200) {
			r := rq(64)
			r.Hash = h
			a, b := p.Pick(r, &snap), p.Pick(r, &snap)
			if a.Replica != b.Replica {
				t.Fatalf("%s hash %d: got %d then %d, want the same", name, h, a.Replica, b.Replica)
			}
			seen[a.Replica] = true
		}
		if len(seen) != 3 {
			t.Errorf("%s: ties went to %v over 200 hashes, want all 3 replicas", name, seen)
		}
	}
}

func TestNames(t *testing.T) {
	want := []string{"aibrix-prefix", "chwbl", "dynamo-kv", "kv-aware", "least-loaded", "llm-d", "llm-d-predicted", "mooncake", "mooncake-global",
		"power-of-two", "preble-e2", "random", "round-robin", "session-hash", "sglang-cache-aware"}
	got := Names()
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("Names()[%d]: got %q, want %q", i, got[i], want[i])
		}
	}
	if _, err := New("nope"); err == nil {
		t.Error("New(nope): got nil error, want one")
	}
	if p, err := New(Default); err != nil || NeedsOf(p).Index != Approximate {
		t.Errorf("New(Default): got %v, %v, want kv-aware needing an approximate index", p, err)
	}
	if NeedsOf(RoundRobin{}) != (Needs{}) {
		t.Error("NeedsOf(RoundRobin): want zero Needs")
	}
}

func TestExpNeg(t *testing.T) {
	worst := 0.0
	for x := 0.0; x < 60; x += 0.0007 {
		want := math.Exp(-x)
		worst = max(worst, math.Abs(expNeg(x)-want)/want)
	}
	if worst > 1e-6 {
		t.Errorf("expNeg: got max relative error %g, want ≤ 1e-6", worst)
	}
	if got := resident(10*time.Minute, 0, 1e6, 100); got != 1 {
		t.Errorf("resident with no horizon: got %v, want 1", got)
	}
}

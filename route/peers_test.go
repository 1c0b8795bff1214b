package route

import "testing"

// withMetrics is a healthy replica with own in-flight, engine running and
// waiting counts and KV usage, freshly scraped.
func withMetrics(inFlight, running, waiting int, kv float64) Replica {
	return Replica{ID: "x", Healthy: true, InFlight: inFlight, Running: running, Waiting: waiting, KVUsage: kv, Scraped: true}
}

func TestSGLangCacheAware(t *testing.T) {
	trees := func(a, b int) Snapshot {
		s := Snapshot{Replicas: []Replica{up("a", 5), up("b", 0)}}
		s.Replicas[0].IndexBlocks, s.Replicas[1].IndexBlocks = a, b
		return s
	}
	runPicks(t, SGLangCacheAware{}, []pickCase{
		{name: "imbalanced goes least loaded despite match", snap: Snapshot{Replicas: []Replica{up("a", 100), up("b", 10)}},
			req: rq(160, 10, 0), want: 1, wantReason: ReasonImbalanced},
		{name: "absolute gap without relative gap is balanced", snap: Snapshot{Replicas: []Replica{up("a", 200), up("b", 150)}},
			req: rq(160, 10, 0), want: 0, wantReason: ReasonPrefix},
		{name: "match ratio 0.5 above 0.3 wins", snap: trees(100, 50), req: rq(160, 5, 0), want: 0, wantReason: ReasonPrefix},
		{name: "match ratio 0.2 goes to smallest tree", snap: trees(100, 50), req: rq(160, 2, 0), want: 1, wantReason: ReasonSmallestTree},
		{name: "short prompt (no full block) goes to smallest tree", snap: trees(10, 50), req: rq(10), want: 0, wantReason: ReasonSmallestTree},
	})
}

func TestDynamoKV(t *testing.T) {
	decode := func(a, b int) Snapshot {
		s := Snapshot{Replicas: []Replica{up("a", 1), up("b", 1)}}
		s.Replicas[0].DecodeBlocks, s.Replicas[1].DecodeBlocks = a, b
		return s
	}
	tie := Snapshot{Replicas: []Replica{up("a", 0), up("b", 0)}}
	tie.Replicas[0].IndexBlocks, tie.Replicas[1].IndexBlocks = 30, 10
	runPicks(t, DynamoKV{}, []pickCase{
		// 20 prompt blocks: a costs (20−15)+100+20 = 125, b 20+100+20 = 140.
		{name: "overlap lowers cost", snap: decode(100, 100), req: rq(320, 15, 0), want: 0, wantReason: ReasonPrefix},
		// a: 5+200+20 = 225 > b 140.
		{name: "decode blocks outweigh overlap", snap: decode(200, 100), req: rq(320, 15, 0), want: 1, wantReason: ReasonLeastCost},
		{name: "tie goes to fewest cached blocks", snap: tie, req: rq(320), want: 1},
	})
	// Queued prefill tokens count too: a's 1600 queued tokens = 100 blocks.
	s := decode(0, 0)
	s.Replicas[0].PrefillTokens = 1600
	if d := (DynamoKV{}).Pick(rq(320, 15, 0), &s); d.Replica != 1 {
		t.Errorf("queued prefill: got %d, want 1", d.Replica)
	}
}

func TestLLMD(t *testing.T) {
	snap := Snapshot{Replicas: []Replica{withMetrics(0, 0, 10, 0.5), withMetrics(0, 0, 0, 0.1)}}
	runPicks(t, LLMD{}, []pickCase{
		// a: queue 0 + kv 2×0.5 + prefix 3×1 = 4; b: 2 + 1.8 + 0 = 3.8.
		{name: "full prefix beats empty queue", snap: snap, req: rq(160, 10, 0), want: 0, wantReason: ReasonScore},
		// a: 0 + 1 + 0.6 = 1.6 < 3.8.
		{name: "small prefix loses to empty queue", snap: snap, req: rq(160, 2, 0), want: 1, wantReason: ReasonScore},
	})
	if n := (LLMD{}).Needs(); n.BlockTokens != 64 || n.IndexBlocks != 31250 || n.ScrapeInterval.Milliseconds() != 50 {
		t.Errorf("Needs: got %+v, want 64-token blocks, 31250 blocks, 50 ms", n)
	}
}

func TestAIBrixPrefix(t *testing.T) {
	running := func(rs ...int) Snapshot {
		var s Snapshot
		for _, r := range rs {
			s.Replicas = append(s.Replicas, withMetrics(0, r, 0, 0))
		}
		return s
	}
	runPicks(t, AIBrixPrefix{}, []pickCase{
		{name: "running gap above 8 goes least running", snap: running(20, 5, 10), req: rq(160, 10, 0, 0), want: 1, wantReason: ReasonLeastRunning},
		// mean 3, σ 0.82, bound 3.82: a (4) is out; c has the best ratio.
		{name: "best ratio within mean+σ", snap: running(4, 2, 3), req: rq(160, 10, 5, 10), want: 2, wantReason: ReasonPrefix},
		// mean 3.33, σ 1.89, bound 5.22: c (6) is out; b is next by ratio.
		{name: "best ratio above mean+σ is skipped", snap: running(2, 2, 6), req: rq(160, 0, 5, 10), want: 1, wantReason: ReasonPrefix},
		{name: "equal ratio, fewer running first", snap: running(3, 2, 3), req: rq(160, 5, 5, 0), want: 1, wantReason: ReasonPrefix},
		{name: "no match goes least running", snap: running(3, 1, 2), req: rq(160), want: 1, wantReason: ReasonLeastRunning},
	})
}

func TestPrebleE2(t *testing.T) {
	rp := func(inFlight, recent int) Replica {
		return Replica{ID: "x", Healthy: true, InFlight: inFlight, RecentPrefill: recent}
	}
	runPicks(t, PrebleE2{}, []pickCase{
		// matched 768 > missed 256: among holders a, b, b's load is lower.
		{name: "exploit picks lightest holder", snap: Snapshot{Replicas: []Replica{rp(3, 0), rp(1, 0), rp(0, 0)}},
			req: rq(1024, 48, 48, 0), want: 1, wantReason: ReasonExploit},
		// matched 160 < missed 864: lowest load + prefill over all.
		{name: "explore picks lightest overall", snap: Snapshot{Replicas: []Replica{rp(0, 100000), rp(2, 0), rp(1, 0)}},
			req: rq(1024, 10, 0, 0), want: 2, wantReason: ReasonExplore},
		// the only holder is the heaviest and ≥ 1.5× the lightest: replicate.
		{name: "hot prefix rebalanced to lightest", snap: Snapshot{Replicas: []Replica{rp(10, 0), rp(0, 0), rp(0, 10)}},
			req: rq(1024, 48, 0, 0), want: 1, wantReason: ReasonRebalance},
		{name: "holder lightly loaded keeps it", snap: Snapshot{Replicas: []Replica{rp(0, 100), rp(0, 0), rp(0, 10)}},
			req: rq(1024, 48, 0, 0), want: 0, wantReason: ReasonExploit},
	})
}

func TestMooncake(t *testing.T) {
	queued := func(a int) Snapshot {
		s := Snapshot{Replicas: []Replica{up("a", 0), up("b", 0)}}
		s.Replicas[0].PrefillTokens = a
		return s
	}
	runPicks(t, Mooncake{}, []pickCase{
		{name: "cached prefix wins on an empty queue", snap: queued(0), req: rq(1024, 60, 0), want: 0, wantReason: ReasonLeastTTFT},
		// 5000 queued tokens = 200 ms > the ~40 ms saved.
		{name: "queue outweighs the cached prefix", snap: queued(5000), req: rq(1024, 60, 0), want: 1, wantReason: ReasonLeastTTFT},
	})
}

// TestScoresAreNotTimes: a policy that ranks by a score records it as
// Cost.Score and leaves the time terms zero; one that prices in time
// (preble-e2, mooncake, kv-aware) records Total.
func TestScoresAreNotTimes(t *testing.T) {
	snap := Snapshot{Replicas: []Replica{withMetrics(3, 2, 1, 0.5), withMetrics(1, 1, 0, 0.2)}}
	for _, tc := range []struct {
		name  string
		timed bool
	}{{"least-loaded", false}, {"power-of-two", false}, {"llm-d", false}, {"dynamo-kv", false},
		{"aibrix-prefix", false}, {"preble-e2", true}, {"mooncake", true}, {"kv-aware", true}} {
		p, err := New(tc.name)
		if err != nil {
			t.Fatal(err)
		}
		r := rq(1024, 32, 0)
		r.Costs = make([]Cost, 0, 4)
		d := p.Pick(r, &snap)
		if len(d.Costs) == 0 {
			t.Fatalf("%s: no costs recorded", tc.name)
		}
		for _, k := range d.Costs {
			if timed := k.Total != 0; timed != tc.timed || (!tc.timed && (k.Wait != 0 || k.Prefill != 0)) {
				t.Errorf("%s: candidate %+v, want timed %v", tc.name, k, tc.timed)
			}
		}
	}
}

package route

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// The tests below each show one behaviour the whole-request cost model
// adds (issue "Step 2"): the externality, the engine's queue, replication,
// bursts and the residency shape.

// decoding is a healthy, freshly scraped replica running n decodes.
func decoding(n int) Replica {
	r := withMetrics(n, n, 0, 0)
	r.Decoding = n
	return r
}

// TestKVAwareExternality: a TTFT-only model sends a long prompt to the
// replica that starts it first, one with a big running batch; pricing
// what its prefill and its decode cost the 40 running requests sends it to
// the replica with a short queue and no batch.
func TestKVAwareExternality(t *testing.T) {
	busy := decoding(40)
	queue := up("q", 1)
	queue.PrefillTokens = 3000 // 140 ms of prefill ahead
	r := rq(4000)
	r.MaxTokens = 256
	r.Costs = make([]Cost, 0, 2)
	d := KVAware{}.Pick(r, &Snapshot{Replicas: []Replica{busy, queue}})
	b, q := d.Costs[0], d.Costs[1]
	if b.Wait+b.Prefill >= q.Wait+q.Prefill {
		t.Fatalf("setup: the busy replica's TTFT %v should beat the queued one's %v", b.Wait+b.Prefill, q.Wait+q.Prefill)
	}
	if d.Replica != 1 {
		t.Errorf("got %d, want 1: the busy replica's 40 decodes would each stall for its prefill (%v to others)", d.Replica, b.Others)
	}
	// Each running decode stalls for the whole prefill: 4,000 × 46 µs +
	// 4,000 × 2,000 × 1.5 ns = 196 ms, so ten more running decodes cost
	// the others at least 1.96 s more (and their slower iterations more).
	one, two := decoding(10), decoding(20)
	r.Costs = make([]Cost, 0, 2)
	d = KVAware{}.Pick(r, &Snapshot{Replicas: []Replica{one, two}})
	if got := d.Costs[1].Others - d.Costs[0].Others; got < 1960*time.Millisecond || got > 3*time.Second {
		t.Errorf("Others at batch 20 − at batch 10 = %v, want 1.96 s of stall and a little slowdown", got)
	}
}

// TestKVAwareQueueGrowsNonLinearly: the wait grows with the queue, each
// queued iteration also steps the running decodes (so a bigger batch
// drains a queue more slowly), and once every seat is taken each extra
// request waits for a seat: the wait's increments grow.
func TestKVAwareQueueGrowsNonLinearly(t *testing.T) {
	rates := Rates{MaxSeqs: 16}
	wait := func(waiting, running int) time.Duration {
		rp := withMetrics(running+waiting, running, waiting, 0.2)
		rp.Decoding, rp.Rates = running, rates
		rp.PrefillTokens = 1000 * waiting
		r := rq(1000)
		r.Costs = make([]Cost, 0, 1)
		return KVAware{}.Pick(r, &Snapshot{Replicas: []Replica{rp}}).Costs[0].Wait
	}
	if a, b := wait(8, 2), wait(8, 14); b <= a {
		t.Errorf("same queue, batch 14 vs 2: wait %v vs %v, want longer behind the bigger batch", b, a)
	}
	below := wait(2, 8) - wait(1, 8)   // 10 of 16 seats
	above := wait(12, 8) - wait(11, 8) // 20 of 16 seats
	if above <= 2*below {
		t.Errorf("one more waiting request adds %v below saturation, %v above: want a knee", below, above)
	}
}

// TestKVAwareReplicatesHotPrefixAndStops: a prefix's sole holder keeps its
// requests while its batch is light; as the batch grows there comes a
// point past which a second holder is made (ReasonReplicate), and past it
// the answer does not flip back. When the load falls again, no copy is
// made.
func TestKVAwareReplicatesHotPrefixAndStops(t *testing.T) {
	r := rq(4200, 256, 0, 0) // a 4,096-token shared prefix
	flipped := -1
	for b := 0; b <= 120; b += 2 {
		holder := decoding(b)
		d := KVAware{}.Pick(r, &Snapshot{Replicas: []Replica{holder, decoding(2), decoding(2)}})
		switch {
		case d.Replica == 0 && flipped >= 0:
			t.Fatalf("batch %d: back to the holder after replicating at %d", b, flipped)
		case d.Replica == 0 && d.Reason != ReasonPrefix:
			t.Fatalf("batch %d: holder chosen for %q, want %q", b, d.Reason, ReasonPrefix)
		case d.Replica != 0 && flipped < 0:
			if d.Reason != ReasonReplicate {
				t.Fatalf("batch %d: replicated with reason %q", b, d.Reason)
			}
			flipped = b
		}
	}
	if flipped <= 0 || flipped >= 120 {
		t.Fatalf("replication at batch %d: want some point inside 1..119", flipped)
	}
	t.Logf("the holder keeps the prefix up to a batch of %d (the others run 2)", flipped-2)
	// Light load everywhere: no copy.
	if d := (KVAware{}).Pick(r, &Snapshot{Replicas: []Replica{decoding(3), decoding(0), decoding(0)}}); d.Replica != 0 {
		t.Errorf("light load: got %d %q, want the holder", d.Replica, d.Reason)
	}
}

// TestKVAwareBurstWaitsForPrefix: two requests sharing a 6,000-token
// prefix arrive together. The first went to A, which has not computed the
// prefix yet (its prefill is still queued), but the index already matches
// it there. The second waits behind that prefill and reuses it rather
// than computing the prefix again on idle B: waiting costs about what
// computing costs, and computing it twice costs the fleet twice (on caches
// that evict, Displaced: the copy on B evicts tokens asked for again).
// Behind a queue of unrelated work as long, it goes to B.
func TestKVAwareBurstWaitsForPrefix(t *testing.T) {
	a, b := up("a", 1), up("b", 0)
	a.PrefillTokens = 6200
	a.Rates.Displaced, b.Rates.Displaced = 0.5, 0.5
	r := rq(6200, 375, 0)
	if d := (KVAware{}).Pick(r, &Snapshot{Replicas: []Replica{a, b}}); d.Replica != 0 || d.Reason != ReasonPrefix {
		t.Errorf("burst: got %d %q, want 0 %q (wait for the prefix's first prefill)", d.Replica, d.Reason, ReasonPrefix)
	}
	if d := (KVAware{}).Pick(rq(6200, 0, 0), &Snapshot{Replicas: []Replica{a, b}}); d.Replica != 1 {
		t.Errorf("unrelated queue: got %d, want 1", d.Replica)
	}
}

// TestResidentShape checks resident against an LRU cache driven by
// Poisson arrivals of equal prompts: a block survives while the tokens
// stored after it stay below the capacity. The step at the horizon is
// sharp for a cache of many prompts and soft for one of a few.
func TestResidentShape(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 11))
	for _, tc := range []struct{ capacity, tokens float64 }{{450_000, 2000}, {80_000, 4000}} {
		rate := 50.0 // prompts per second
		h := time.Duration(tc.capacity / (rate * tc.tokens) * float64(time.Second))
		for _, x := range []float64{0.5, 0.8, 0.9, 1, 1.1, 1.25, 1.5} {
			age := time.Duration(x * float64(h))
			survived, trials := 0, 4000
			for range trials {
				stored, at := 0.0, 0.0
				for {
					at += rng.ExpFloat64() / rate
					if at > age.Seconds() {
						break
					}
					stored += tc.tokens
				}
				if stored < tc.capacity {
					survived++
				}
			}
			got, want := resident(age, h, tc.capacity, tc.tokens), float64(survived)/float64(trials)
			if math.Abs(got-want) > 0.06 {
				t.Errorf("capacity %.0f, prompts %.0f, age %.2f × horizon: resident %.3f, LRU %.3f", tc.capacity, tc.tokens, x, got, want)
			}
		}
	}
}

// TestKVAwareIgnoresNaNUsage: a scrape that says NaN of its KV usage
// neither makes a replica free nor poisons the choice: kv-aware prices it
// on its own counts, as if the engine had said nothing.
func TestKVAwareIgnoresNaNUsage(t *testing.T) {
	nan := decoding(20)
	nan.KVUsage, nan.CacheBlocks = math.NaN(), 28000
	light := decoding(2)
	light.CacheBlocks = 28000
	r := rq(2048)
	r.Costs = make([]Cost, 0, 2)
	d := KVAware{}.Pick(r, &Snapshot{Replicas: []Replica{nan, light}})
	if d.Replica != 1 {
		t.Errorf("got %d, want the lightly loaded replica 1", d.Replica)
	}
	for _, k := range d.Costs {
		if k.Total <= 0 || k.Memory < 0 {
			t.Errorf("candidate %+v: want finite, positive terms", k)
		}
	}
}

// TestKVAwareContextOutlivesArrivals: two replicas run four sequences
// each, below the fleet's mean of eight, one holding long contexts (64,000
// tokens) and one short ones (3,200). Arrivals bring both to the mean
// batch at once, but the context their sequences hold now leaves only as
// they finish: over a decode of one sequence life (256 tokens), (1 −
// e^{−1}) of it is still there on average. So the long one's decode costs
// 256 × 56 ms per million tokens × 60,800 × 0.632 = 551 ms more, and the
// request goes to the short one, where pricing the batch alone saw two
// replicas at the fleet's mean.
func TestKVAwareContextOutlivesArrivals(t *testing.T) {
	long, short := up("long", 4), up("short", 4)
	long.DecodeBlocks, short.DecodeBlocks = 4*1000, 4*50
	busy := up("busy", 12)
	busy.DecodeBlocks = 12 * 300
	r := rq(1000)
	r.MaxTokens = 256
	r.Costs = make([]Cost, 0, 4)
	d := KVAware{}.Pick(r, &Snapshot{Replicas: []Replica{long, short, busy, busy}})
	if d.Replica != 1 {
		t.Errorf("got %d, want 1: the short contexts", d.Replica)
	}
	want := 256 * 56 * 60800 / 1e6 * (1 - math.Exp(-1)) // ms
	if got := float64(d.Costs[0].Decode-d.Costs[1].Decode) / 1e6; math.Abs(got-want) > 1 {
		t.Errorf("Decode of the long contexts − of the short = %.1f ms, want %.1f", got, want)
	}
}

// TestKVAwareEachReplicaItsOwnDisplaced: a copy of the holder's prefix
// costs each replica what its own measured Displaced says. Replica 1
// evicts nothing anyone asks for again (0), replica 2 only such tokens
// (1), the holder something in between; all share one preset, whose
// filled-in rates kv-aware caches once per Pick, so a per-replica field
// the cache kept would price them all as the first one priced.
func TestKVAwareEachReplicaItsOwnDisplaced(t *testing.T) {
	s := &Snapshot{Replicas: []Replica{up("holder", 0), up("free", 0), up("full", 0)}}
	s.Replicas[0].PrefillTokens = 20000 // a long queue: the copies are priced
	s.Replicas[0].Rates.Displaced, s.Replicas[1].Rates.Displaced, s.Replicas[2].Rates.Displaced = 0.5, 0, 1
	r := rq(1000, 62, 0, 0) // 992 tokens cached on the holder
	r.Costs = make([]Cost, 0, 3)
	d := KVAware{}.Pick(r, s)
	rt := s.Replicas[2].Rates.WithDefaults()
	want := 2 * rt.prefillNS(992, 0) // (2 + mean batch 0) × Displaced 1 × the copy's prefill
	if m := d.Costs[1].Memory; m != 0 {
		t.Errorf("Memory of the replica that displaces nothing = %v, want 0", m)
	}
	if m := float64(d.Costs[2].Memory); math.Abs(m-want) > 1e3 {
		t.Errorf("Memory of the replica whose evictions are all asked for again = %v, want %v", time.Duration(m), time.Duration(want))
	}
}

// TestKVAwareWaitsForTheIterationUnderWay: an engine admits a request
// between iterations, so on a replica that is decoding the request first
// waits for the rest of the iteration under way (half a step on average),
// and its prefill then runs in a decode step; on an idle replica it starts
// at once, in an iteration of only the step overhead.
func TestKVAwareWaitsForTheIterationUnderWay(t *testing.T) {
	busy := up("busy", 3)
	busy.Decoding, busy.DecodeBlocks = 3, 3*100
	r := rq(1000)
	r.Costs = make([]Cost, 0, 2)
	d := KVAware{}.Pick(r, &Snapshot{Replicas: []Replica{busy, idle()}})
	rt := Rates{}.WithDefaults()
	step := rt.stepNS(3, 3*100*16)
	compute := rt.prefillNS(1000, 0)
	for _, c := range []struct {
		name          string
		got           Cost
		wait, prefill float64
	}{
		{"busy", d.Costs[0], step / 2, compute + step},
		{"idle", d.Costs[1], 0, compute + float64(DefaultStepOverhead)},
	} {
		if math.Abs(float64(c.got.Wait)-c.wait) > 1 || math.Abs(float64(c.got.Prefill)-c.prefill) > 1 {
			t.Errorf("%s: Wait %v, Prefill %v; want %v, %v", c.name, c.got.Wait, c.got.Prefill,
				time.Duration(c.wait), time.Duration(c.prefill))
		}
	}
}

// TestKVAwareImportWaitsForOneBoundary: a request whose prefix crosses a
// link first is admitted at an iteration boundary and computes the rest
// at the first boundary after the blocks land. On a decoding replica each
// is half a step away on average; an idle one starts at once and runs the
// rest's iteration when the blocks land.
func TestKVAwareImportWaitsForOneBoundary(t *testing.T) {
	link := Rates{TransferPerMTokens: 2600 * time.Microsecond} // 50 GB/s of 128 KiB tokens
	holder, busy, idle := up("holder", 0), up("busy", 3), up("idle", 0)
	holder.InFlight, holder.DecodeBlocks = 4, 4*8192 // long contexts, a slow decode: the others import
	busy.Decoding, busy.DecodeBlocks = 3, 3*100
	for _, rp := range []*Replica{&holder, &busy, &idle} {
		rp.Rates = link
	}
	r := rq(8192, 500, 0, 0)
	r.Costs = make([]Cost, 0, 3)
	d := KVAware{}.Pick(r, &Snapshot{Replicas: []Replica{holder, busy, idle}})
	rt := link.WithDefaults()
	step := rt.stepNS(3, 3*100*16)
	for _, c := range []struct {
		name string
		got  Cost
		wait float64
	}{
		{"busy", d.Costs[1], step},
		{"idle", d.Costs[2], 0},
	} {
		if c.got.Import.Blocks == 0 {
			t.Fatalf("%s: %+v, want an import", c.name, c.got)
		}
		if math.Abs(float64(c.got.Wait)-c.wait) > 1 {
			t.Errorf("%s: Wait %v, want %v", c.name, c.got.Wait, time.Duration(c.wait))
		}
	}
}

// TestKVAwarePricesSessionsFuture: a new conversation starts with a
// 1,500-token system prompt that only replica 0 caches, and replica 0
// has had 90% of the router's requests, so the later turns of this one
// would meet the batch they keep there, 90% of the fleet's three
// running sequences. The prompt was last asked for an hour ago, so a
// copy of it would serve few later sessions. A request without a
// session goes to the holder: its prefill there is shortest. The first
// turn of a session that is expected to bring six more goes to an idle
// replica: the system prompt's prefill is paid once, the busy holder by
// every later turn. A turn whose long history is cached on the holder
// stays: moving would pay the history again.
func TestKVAwarePricesSessionsFuture(t *testing.T) {
	holder := decoding(2)
	holder.Share, holder.ShareSeq = 0.9, 100
	holder.Rates.Horizon = 2 * time.Hour
	snap := func() *Snapshot {
		s := &Snapshot{Replicas: []Replica{holder, up("b", 0), up("c", 0), up("d", 0)}, Seqs: 3}
		for i := 1; i < 4; i++ {
			s.Replicas[i].Share, s.Replicas[i].ShareSeq = 0.1/3, 100
			s.Replicas[i].Rates.Horizon = 2 * time.Hour
		}
		return s
	}
	first := func(turns float64) *Request {
		r := rq(1600, 1500/16, 0, 0, 0)
		r.Age = []time.Duration{time.Hour, 0, 0, 0}
		r.Seq, r.MaxTokens, r.Session, r.FutureTurns = 101, 32, 99, turns
		r.Costs = make([]Cost, 0, 4)
		return r
	}
	if d := (KVAware{}).Pick(first(0), snap()); d.Replica != 0 || d.Reason != ReasonPrefix {
		t.Errorf("no later turns: got %d %q, want the holder (%q)", d.Replica, d.Reason, ReasonPrefix)
	}
	d := (KVAware{}).Pick(first(6), snap())
	if d.Replica == 0 || d.Reason != ReasonReplicate {
		t.Errorf("six later turns: got %d %q, want an idle replica (%q)", d.Replica, d.Reason, ReasonReplicate)
	}
	if h, o := d.Costs[0].Future, d.Costs[1].Future; !(h > o && o > 0) {
		t.Errorf("future: holder %v, idle %v; want both positive, the holder's dearer", h, o)
	}
	later := rq(8000, 8000/16, 0, 0, 0)
	later.Seq, later.MaxTokens, later.Session, later.FutureTurns, later.Pinned = 101, 32, 99, 6, 0
	if d := (KVAware{}).Pick(later, snap()); d.Replica != 0 || d.Reason != ReasonSession {
		t.Errorf("a long history on the holder: got %d %q, want it kept (%q)", d.Replica, d.Reason, ReasonSession)
	}
}

// TestKVAwareSharesACopyWithLaterSessions: replica 0 holds a 1,500-token
// system prompt and had all the router's requests, a fifth of a
// sequence running on average: a new session's later turns would meet a
// batch there about a fifth of the time. That saves less than the system prompt's
// prefill elsewhere costs this session, so when the prompt is seldom
// asked for (last an hour ago) the session starts on the holder. When
// every session asks for it (last half a second ago), a copy on an idle
// replica serves the many sessions that will start there while it
// stays: this one pays a sliver of it and starts there, and the credit
// is nearly the whole prefill.
func TestKVAwareSharesACopyWithLaterSessions(t *testing.T) {
	holder := decoding(1)
	holder.Share, holder.ShareSeq = 1, 100
	holder.Rates.Horizon = 2 * time.Hour
	for _, tc := range []struct {
		name string
		age  time.Duration
		want int
	}{{"seldom asked", time.Hour, 0}, {"asked by every session", 500 * time.Millisecond, 1}} {
		idle := up("b", 0)
		idle.Rates.Horizon = 2 * time.Hour // what it caches stays two hours
		s := &Snapshot{Replicas: []Replica{holder, idle}, Seqs: 0.2}
		r := rq(1700, 1500/16, 0)
		r.Age = []time.Duration{tc.age, 0}
		r.Seq, r.MaxTokens, r.Session, r.FutureTurns = 101, 32, 99, 5
		r.Costs = make([]Cost, 0, 2)
		d := (KVAware{}).Pick(r, s)
		if d.Replica != tc.want {
			t.Errorf("%s: got %d %q, want %d", tc.name, d.Replica, d.Reason, tc.want)
		}
		if tc.want == 1 {
			idle, hold := d.Costs[1], d.Costs[0]
			copy := 2 * (idle.Prefill - hold.Prefill)
			if credit := hold.Future - idle.Future; credit < copy*9/10 {
				t.Errorf("%s: the copy's credit %v, want most of the %v its prefill costs", tc.name, credit, copy)
			}
		}
	}
}

// TestKVAwareStallWeighsShortAnswers: two replicas alike but for their
// running requests' lengths: 8 requests answering in 16 tokens each on
// one, 8 answering in 1,024 on the other. A prompt of 4,000 tokens
// stalls whichever batch it joins for its prefill; on the first that
// adds a quarter of the prefill to each short answer's inter-token
// gaps, on the second almost nothing, so the stall there weighs, per
// token at the fleet's harmonic-mean output (about 32 tokens), 8 ×
// (1/16)/(1/31.5) ≈ 15.8 sequences against 0.25: the request goes to
// the long answers. Without the lengths (Outputs 0) both weigh their 8
// sequences and price the same.
func TestKVAwareStallWeighsShortAnswers(t *testing.T) {
	snap := func(known bool) *Snapshot {
		s := &Snapshot{BlockSize: 16, Replicas: []Replica{
			{ID: "short", Healthy: true, InFlight: 8, Decoding: 8, DecodeBlocks: 8 * 1000 / 16},
			{ID: "long", Healthy: true, InFlight: 8, Decoding: 8, DecodeBlocks: 8 * 1000 / 16},
		}}
		if known {
			s.Replicas[0].Outputs, s.Replicas[0].InvOutput = 8, 8.0/16
			s.Replicas[1].Outputs, s.Replicas[1].InvOutput = 8, 8.0/1024
		}
		return s
	}
	r := &Request{ID: "r", Tokens: 4000, MaxTokens: 200, Blocks: 250, Match: []int{0, 0}, Pinned: -1, Costs: make([]Cost, 0, 2)}
	d := KVAware{}.Pick(r, snap(true))
	if d.Replica != 1 {
		t.Fatalf("chose %d (%+v), want the replica of long answers", d.Replica, d.Costs)
	}
	short, long := d.Costs[0].Others, d.Costs[1].Others
	rt := Rates{}.WithDefaults()
	compute := rt.prefillNS(4000, 0)
	harmonic := 16.0 / (8.0/16 + 8.0/1024)
	want := (8*harmonic/16 - 8*harmonic/1024) * compute
	if got := float64(short - long); math.Abs(got-want) > 1e-6*want {
		t.Errorf("Others differ by %v, want the stall weights' difference × the prefill, %v", time.Duration(got), time.Duration(want))
	}
	r.Costs = r.Costs[:0]
	d = KVAware{}.Pick(r, snap(false))
	if d.Costs[0].Others != d.Costs[1].Others {
		t.Errorf("without output lengths: Others %v and %v, want equal", d.Costs[0].Others, d.Costs[1].Others)
	}
}

// TestKVAwareWaitsForKVRoom: two replicas alike but for their KV
// capacity, each with 40 sequences answering in 500 tokens in 6,000
// blocks. The blocks in use (the router's footprint of its requests)
// exceed one's capacity by a tenth: vLLM admits nothing there until its
// sequences have freed the excess and the request's own blocks, which
// they do at 1/500 of their blocks a step, so the request waits
// (over/used) × 500 steps more there than on the other, which has room;
// and goes to the other. With the capacity unknown, neither waits for
// room.
func TestKVAwareWaitsForKVRoom(t *testing.T) {
	const used, batch = 6000, 40
	rp := func(id string, capacity int) Replica {
		return Replica{ID: id, Healthy: true, InFlight: batch, Decoding: batch, DecodeBlocks: used, CacheBlocks: capacity,
			Outputs: batch, InvOutput: batch / 500.0}
	}
	s := &Snapshot{BlockSize: 16, Replicas: []Replica{rp("full", used*10/11), rp("roomy", 2*used)}}
	r := &Request{ID: "r", Tokens: 2000, MaxTokens: 200, Blocks: 125, Match: []int{0, 0}, Pinned: -1, Costs: make([]Cost, 0, 2)}
	d := KVAware{}.Pick(r, s)
	if d.Replica != 1 {
		t.Fatalf("chose %d (%+v), want the replica with room", d.Replica, d.Costs)
	}
	over := used + (2000+200)/16.0 - float64(used*10/11)
	rt := Rates{}.WithDefaults()
	n, context := batchOf(&s.Replicas[0], false, 16)
	want := over / used * 500 * rt.stepNS(n, context)
	if got := float64(d.Costs[0].Wait - d.Costs[1].Wait); math.Abs(got-want) > 1e-6*want+1 {
		t.Errorf("Wait differs by %v, want the wait for room, %v", time.Duration(got), time.Duration(want))
	}
	for i := range s.Replicas {
		s.Replicas[i].CacheBlocks = 0
	}
	r.Costs = r.Costs[:0]
	if d := (KVAware{}).Pick(r, s); d.Costs[0].Wait != d.Costs[1].Wait {
		t.Errorf("capacity unknown: Wait %v and %v, want equal", d.Costs[0].Wait, d.Costs[1].Wait)
	}
}

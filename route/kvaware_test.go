package route

import (
	"reflect"
	"testing"
	"time"
)

// The tests below each show one behaviour of docs/kv-aware.md falling out of
// the kv-aware cost model. Default rates: 46 µs per prompt token, so a
// 1,024-token prefill costs about 48 ms.

// idle is a healthy idle replica.
func idle() Replica { return up("x", 0) }

// queued is a healthy replica with tokens of our own prefill queued.
func queued(tokens int) Replica {
	r := up("x", tokens/1000+1)
	r.PrefillTokens = tokens
	return r
}

// pinned is rq with the session bound to replica pin.
func pinned(pin, tokens int, match ...int) *Request {
	r := rq(tokens, match...)
	r.Pinned, r.Session = pin, 77
	return r
}

func TestKVAwareSessionAffinity(t *testing.T) {
	runPicks(t, KVAware{}, []pickCase{
		// b holds 960 of 1024 tokens: 20 ms of queue + 3 ms prefill beats
		// 42 ms of full prefill on idle a.
		{name: "pinned replica with long match wins over an idle one", snap: Snapshot{Replicas: []Replica{idle(), queued(500)}},
			req: pinned(1, 1024, 0, 60), want: 1, wantReason: ReasonSession},
		{name: "pin alone only breaks exact ties", snap: Snapshot{Replicas: []Replica{idle(), idle(), idle()}},
			req: pinned(2, 1024), want: 2, wantReason: ReasonLeastCost},
		{name: "pin alone does not beat a shorter queue", snap: Snapshot{Replicas: []Replica{idle(), queued(200)}},
			req: pinned(1, 1024), want: 0, wantReason: ReasonLeastCost},
	})
}

func TestKVAwareShortPrefixDiscounted(t *testing.T) {
	runPicks(t, KVAware{}, []pickCase{
		// One 16-token block saves 0.64 ms; a's 4 ms queue costs more.
		{name: "tiny match does not override a small load gap", snap: Snapshot{Replicas: []Replica{queued(100), idle()}},
			req: rq(1024, 1, 0), want: 1},
		{name: "tiny match does not override a big load gap", snap: Snapshot{Replicas: []Replica{queued(4000), idle()}},
			req: rq(1024, 1, 0), want: 1},
		// The same small gap loses to a long match.
		{name: "long match does override a small load gap", snap: Snapshot{Replicas: []Replica{queued(100), idle()}},
			req: rq(1024, 60, 0), want: 0, wantReason: ReasonPrefix},
		{name: "unique traffic goes to least cost", snap: Snapshot{Replicas: []Replica{queued(100), idle(), queued(50)}},
			req: rq(1024), want: 1, wantReason: ReasonLeastCost},
	})
}

func TestKVAwareDecaysOldEntries(t *testing.T) {
	horizon := Rates{Horizon: 5 * time.Minute}
	a, b := queued(200), queued(200) // equally loaded
	a.Rates, b.Rates = horizon, horizon
	snap := Snapshot{Replicas: []Replica{a, b}}
	r := rq(1024, 32, 32)
	r.Age = []time.Duration{30 * time.Minute, 10 * time.Second}
	d := KVAware{}.Pick(r, &snap)
	if d.Replica != 1 || d.Reason != ReasonPrefix {
		t.Errorf("same match, old vs fresh: got %d %q, want 1 %q", d.Replica, d.Reason, ReasonPrefix)
	}
	// Well inside the horizon the prefix is still there: all 512 tokens.
	if d.Matched != 512 {
		t.Errorf("predicted cached: got %d, want 512", d.Matched)
	}
	// Without a horizon nothing decays: both hold 512 tokens, a is idle.
	snap.Replicas[0] = idle()
	snap.Replicas[1].Rates = Rates{}
	if d := (KVAware{}).Pick(r, &snap); d.Replica != 0 {
		t.Errorf("no horizon: got %d, want 0", d.Replica)
	}
}

// TestKVAwareWarmPrefixOfAnOldMatch: replica 0 last served this
// conversation long past its horizon, so its 7,000-token match as a whole
// is likely gone; but other requests sharing the first 6,000 tokens (the
// group's context) touched them 10 s ago (Request.Fresh). Those are still
// resident: 6,000 tokens are expected cached there, the old turns past
// them are not, and the request goes to replica 0 although replica 1 is
// idle. Without the fresh part, replica 0's match counts as evicted.
func TestKVAwareWarmPrefixOfAnOldMatch(t *testing.T) {
	horizon := Rates{Horizon: time.Minute}
	a, b := queued(2000), idle()
	a.Rates, b.Rates = horizon, horizon
	snap := Snapshot{Replicas: []Replica{a, b}}
	r := rq(8000, 7000/16, 0)
	r.Age = []time.Duration{5 * time.Minute, 0}
	if d := (KVAware{}).Pick(r, &snap); d.Replica != 1 || d.Matched != 0 {
		t.Errorf("old match, nothing known warm: got %d with %d cached, want 1 with 0", d.Replica, d.Matched)
	}
	r.Fresh, r.FreshAge = []int{6000 / 16, 0}, []time.Duration{10 * time.Second, 0}
	d := KVAware{}.Pick(r, &snap)
	if d.Replica != 0 || d.Matched != 6000 {
		t.Errorf("warm shared context: got %d with %d cached, want 0 with 6000", d.Replica, d.Matched)
	}
}

func TestKVAwareStickinessBreaksUnderLoad(t *testing.T) {
	runPicks(t, KVAware{}, []pickCase{
		// 20 ms of queue < 42 ms of prefill saved: stay.
		{name: "holder with a short queue keeps the session", snap: Snapshot{Replicas: []Replica{queued(500), idle()}},
			req: pinned(0, 1040, 64, 0), want: 0, wantReason: ReasonSession},
		// 800 ms of queue > 42 ms saved: leave.
		{name: "holder with a deep queue loses to an idle replica", snap: Snapshot{Replicas: []Replica{queued(20000), idle()}},
			req: pinned(0, 1040, 64, 0), want: 1, wantReason: ReasonReplicate},
	})
}

func TestKVAwareHotPrefixSpreads(t *testing.T) {
	// A 4,096-token shared prefix (256 blocks) in a 4,200-token prompt:
	// about 180 ms of prefill saved where it is cached.
	r := rq(4200, 256, 0, 0)
	hot := Snapshot{Replicas: []Replica{queued(30000), idle(), idle()}}
	if d := (KVAware{}).Pick(r, &hot); d.Replica == 0 || d.Reason != ReasonReplicate {
		t.Errorf("overloaded sole holder: got %d %q, want 1 or 2, %q", d.Replica, d.Reason, ReasonReplicate)
	}
	// Once a second replica holds it (the index recorded the spread), it
	// gets the traffic while its queue is cheaper than a fresh prefill...
	r = rq(4200, 256, 256, 0)
	second := Snapshot{Replicas: []Replica{queued(30000), queued(1000), idle()}}
	if d := (KVAware{}).Pick(r, &second); d.Replica != 1 || d.Reason != ReasonPrefix {
		t.Errorf("second holder lightly loaded: got %d %q, want 1 %q", d.Replica, d.Reason, ReasonPrefix)
	}
	// ...and a third copy is made only when both holders are busy.
	third := Snapshot{Replicas: []Replica{queued(30000), queued(30000), idle()}}
	if d := (KVAware{}).Pick(r, &third); d.Replica != 2 || d.Reason != ReasonReplicate {
		t.Errorf("both holders busy: got %d %q, want 2 %q", d.Replica, d.Reason, ReasonReplicate)
	}
}

func TestKVAwareMemoryPressure(t *testing.T) {
	full := withMetrics(0, 0, 0, 0.99)
	roomy := withMetrics(0, 0, 0, 0.5)
	full.CacheBlocks, roomy.CacheBlocks = 1000, 1000
	roomy.PrefillTokens = 100 // 4 ms of queue
	snap := Snapshot{Replicas: []Replica{full, roomy}}
	r := rq(1024, 32, 32)
	r.Costs = make([]Cost, 0, 2)
	d := KVAware{}.Pick(r, &snap)
	if d.Replica != 1 {
		t.Errorf("nearly full vs roomy, same match: got %d, want 1", d.Replica)
	}
	if len(d.Costs) != 2 || d.Costs[0].Memory <= 0 || d.Costs[1].Memory != 0 {
		t.Errorf("memory terms: got %+v, want positive for the full replica, zero for the roomy one", d.Costs)
	}
	// With no pressure the cheaper queue wins as usual.
	snap.Replicas[0].KVUsage = 0.5
	if d := (KVAware{}).Pick(r, &snap); d.Replica != 0 {
		t.Errorf("no pressure: got %d, want 0", d.Replica)
	}
}

func TestKVAwareEdgeCases(t *testing.T) {
	stale := withMetrics(0, 200, 50, 0.2)
	stale.LoadAge = 10 * time.Second
	fresh := stale
	fresh.LoadAge = 50 * time.Millisecond
	never := stale
	never.Scraped, never.LoadAge = false, 0
	sat := func(inFlight int) Replica { return up("x", inFlight) }
	runPicks(t, KVAware{}, []pickCase{
		{name: "no healthy replica", snap: Snapshot{Replicas: []Replica{{ID: "a"}}}, req: rq(100), want: -1, wantReason: ReasonNoHealthy},
		{name: "single replica", snap: Snapshot{Replicas: []Replica{queued(99999)}}, req: rq(100), want: 0},
		{name: "stale metrics ignored: own counts only", snap: Snapshot{Replicas: []Replica{stale, queued(100)}}, req: rq(1024), want: 0},
		{name: "never-scraped metrics ignored", snap: Snapshot{Replicas: []Replica{never, queued(100)}}, req: rq(1024), want: 0},
		{name: "fresh metrics with a foreign queue count", snap: Snapshot{Replicas: []Replica{fresh, queued(100)}}, req: rq(1024), want: 1},
		{name: "all saturated: least over the batch limit", snap: Snapshot{Replicas: []Replica{sat(300), sat(260), sat(280)}}, req: rq(1024), want: 1},
		{name: "unhealthy cheapest skipped", snap: Snapshot{Replicas: []Replica{{ID: "a"}, queued(100), queued(50)}}, req: rq(1024, 60, 0, 0), want: 2},
	})
}

func TestKVAwareScaleAndRates(t *testing.T) {
	slow := idle()
	slow.Rates.Scale = 2
	if d := (KVAware{}).Pick(rq(1024), &Snapshot{Replicas: []Replica{slow, idle()}}); d.Replica != 1 {
		t.Errorf("observed 2× slower: got %d, want 1", d.Replica)
	}
	// Zero rates mean exactly the documented defaults.
	explicit := idle()
	explicit.Rates = Rates{PrefillPerToken: DefaultPrefillPerToken, AttnPerMPairs: DefaultAttnPerMPairs,
		DecodeStep: DefaultDecodeStep, DecodePerSeq: DefaultDecodePerSeq, MaxSeqs: DefaultMaxSeqs, Scale: 1}
	r := rq(3000, 100, 100)
	r.Costs = make([]Cost, 0, 2)
	d := KVAware{}.Pick(r, &Snapshot{Replicas: []Replica{idle(), explicit}})
	d.Costs[1].Replica = 0
	if d.Costs[0].Prefill != d.Costs[1].Prefill || d.Costs[0].Decode != d.Costs[1].Decode {
		t.Errorf("zero vs explicit default rates: got %+v and %+v, want equal prefill and decode", d.Costs[0], d.Costs[1])
	}
	// 3,000 tokens, 1,600 cached: 1,400 × 46 µs + 1,400 × 2,300 × 1.5 ns,
	// in one iteration of an empty batch: the step overhead (1.5 ms), no
	// decode step (the engine's iteration with nothing to decode).
	if want := 64400*time.Microsecond + 4830*time.Microsecond + 1500*time.Microsecond; d.Costs[0].Prefill != want {
		t.Errorf("prefill: got %v, want %v", d.Costs[0].Prefill, want)
	}
}

func TestKVAwareCostsRecorded(t *testing.T) {
	snap := Snapshot{Replicas: []Replica{queued(300), {ID: "down"}, idle()}}
	r := rq(1024, 10, 10, 20)
	r.Costs = make([]Cost, 0, 8)
	d := KVAware{}.Pick(r, &snap)
	if len(d.Costs) != 2 || d.Costs[0].Replica != 0 || d.Costs[1].Replica != 2 {
		t.Fatalf("got costs %+v, want entries for healthy replicas 0 and 2", d.Costs)
	}
	for _, c := range d.Costs {
		// The time to first token counts twice: once on its own, once as
		// part of the time to the last token.
		if d := c.Total - (2*(c.Wait+c.Prefill) + c.Decode + c.Others + c.Memory); d < -3 || d > 3 {
			t.Errorf("replica %d: Total %v, want 2 × (Wait + Prefill) + Decode + Others + Memory", c.Replica, c.Total)
		}
		if c.Replica == d.Replica && c.Matched != d.Matched {
			t.Errorf("chosen replica's Matched %d, Decision.Matched %d: want equal", c.Matched, d.Matched)
		}
	}
	r.Costs = make([]Cost, 0, 1)
	if d := (KVAware{}).Pick(r, &snap); d.Costs != nil {
		t.Error("Costs with too little capacity: want none recorded")
	}
}

func TestKVAwareMonotone(t *testing.T) {
	r := rq(2048, 64)
	r.Costs = make([]Cost, 0, 1)
	var prev Cost
	for step := range 40 {
		rp := withMetrics(step*4, step*8, step, float64(step)/40)
		rp.PrefillTokens, rp.Decoding, rp.CacheBlocks, rp.DecodeBlocks = step*500, step*2, 2000, step*50
		d := KVAware{}.Pick(r, &Snapshot{Replicas: []Replica{rp}})
		c := d.Costs[0]
		if step > 0 && (c.Wait < prev.Wait || c.Decode < prev.Decode || c.Memory < prev.Memory || c.Total < prev.Total) {
			t.Fatalf("step %d: got %+v after %+v, want every term non-decreasing with load", step, c, prev)
		}
		prev = c
	}
	if prev.Memory == 0 {
		t.Error("memory term never rose at KV usage near 1")
	}
}

// TestKVAwareHugeOutputSaturates: a request asking for a billion output
// tokens prices beyond what a Duration holds; its terms read as the
// longest Duration, never as negative ones (which would rank it first).
func TestKVAwareHugeOutputSaturates(t *testing.T) {
	s := &Snapshot{BlockSize: 16, Replicas: []Replica{
		{ID: "a", Healthy: true, CacheBlocks: 28000, DecodeBlocks: 27000, InFlight: 30},
		{ID: "b", Healthy: true, CacheBlocks: 28000},
	}}
	r := &Request{ID: "huge", Tokens: 1000, MaxTokens: 1_000_000_000, Pinned: -1, Costs: make([]Cost, 0, 2)}
	d := KVAware{}.Pick(r, s)
	for _, k := range d.Costs {
		for _, v := range []time.Duration{k.Wait, k.Prefill, k.Decode, k.Others, k.Memory, k.Total} {
			if v < 0 {
				t.Fatalf("replica %d: a negative term in %+v", k.Replica, k)
			}
		}
	}
	if d.Replica != 1 {
		t.Errorf("chose %d, want the idle replica", d.Replica)
	}
}

// TestSamePresetCoversTheSharedRates: kv-aware fills in one replica's
// Rates and reuses them for every replica whose shared fields agree
// (samePreset), copying only the learned, per-replica ones. So every
// other field of Rates must tell two presets apart, including one added
// later.
func TestSamePresetCoversTheSharedRates(t *testing.T) {
	perReplica := map[string]bool{"Horizon": true, "TierHorizon": true, "Displaced": true, "Scale": true, "DecodeScale": true,
		"HitScale": true, "Spread": true, "DecodeSpread": true, "TransferPerMTokens": true, "LoadPerMTokens": true}
	typ := reflect.TypeFor[Rates]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		a, b := Rates{}, Rates{}
		v := reflect.ValueOf(&b).Elem().Field(i)
		switch v.Kind() {
		case reflect.Int, reflect.Int64:
			v.SetInt(3)
		case reflect.Float64:
			v.SetFloat(3)
		default:
			t.Fatalf("Rates.%s: kind %v not handled", f.Name, v.Kind())
		}
		if got := samePreset(&a, &b); got != perReplica[f.Name] {
			t.Errorf("samePreset with Rates.%s changed = %v, want %v", f.Name, got, perReplica[f.Name])
		}
	}
}

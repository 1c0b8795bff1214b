package route

import (
	"math"
	"testing"
	"time"
)

// TestKVAwareMissProbabilityExact prices the miss term over literal
// snapshots and checks its terms. On an idle replica only the request's
// own misses count: with bounds at twice its predicted time to first
// token and half its predicted inter-token latency, and the prior spread
// ln 2, z = ∓ln 2/ln 2 = ∓1, so each side misses with the normal's
// Φ(∓1). On a decoding replica the others' term is the
// batch and half the joiners, times the rise of their chance of missing
// the ITL bound, times their miss price.
func TestKVAwareMissProbabilityExact(t *testing.T) {
	const out = 100
	r := &Request{ID: "m", Hash: 7, Tokens: 1024, Blocks: 64, MaxTokens: out, Pinned: -1, Costs: make([]Cost, 0, 1)}
	idle := &Snapshot{Replicas: []Replica{{ID: "a", Healthy: true, CacheBlocks: 28000}}}
	free := KVAware{}.Pick(r, idle).Costs[0]
	if free.Miss != 0 || free.Misses != 0 {
		t.Fatalf("no SLO: Miss %v, Misses %v, want 0", free.Miss, free.Misses)
	}
	ttft, itl := free.Wait+free.Prefill, free.Decode/out
	r.SLO = SLO{TTFT: 2 * ttft, ITL: itl / 2}
	r.Costs = r.Costs[:0]
	d := KVAware{}.Pick(r, idle)
	k := d.Costs[0]
	pT, pI := 0.15865525393145707, 0.8413447460685429 // Φ(−1), Φ(1)
	want := 1 - (1-pT)*(1-pI)
	if math.Abs(k.Miss-want) > 1e-6 || d.Miss != k.Miss {
		t.Errorf("own miss: Cost.Miss %.9f, Decision.Miss %.9f, want %.9f", k.Miss, d.Miss, want)
	}
	price := 2*float64(r.SLO.TTFT) + out*float64(r.SLO.ITL)
	if got := float64(k.Misses); math.Abs(got-want*price) > 1e-6*price {
		t.Errorf("Misses %v, want P(miss) × (2·TTFT + out·ITL) = %v", k.Misses, time.Duration(want*price))
	}
	if k.Total-free.Total != k.Misses {
		t.Errorf("Total %v − the SLO-less Total %v = %v, want Misses %v", k.Total, free.Total, k.Total-free.Total, k.Misses)
	}

	// A batch of 10 answers of 50 tokens (n̄ = 50) holding 2,048 tokens
	// each, nothing queued: before = step, after = step + Δ + compute/n̄.
	busy := &Snapshot{Replicas: []Replica{{ID: "b", Healthy: true, CacheBlocks: 28000, InFlight: 10, Decoding: 10,
		DecodeBlocks: 10 * 2048 / 16, Outputs: 10, InvOutput: 10.0 / 50, Rates: Rates{Spread: 0.3, DecodeSpread: 0.2}}}}
	rt := Rates{}.WithDefaults()
	step := rt.stepNS(10, 10*2048)
	r.SLO = SLO{TTFT: time.Second, ITL: time.Duration(1.05 * step)}
	r.Costs = r.Costs[:0]
	k = KVAware{}.Pick(r, busy).Costs[0]
	sT, sI := 0.3, 0.2
	own := 1 - (1-normal(float64(k.Wait+k.Prefill), float64(r.SLO.TTFT), sT))*(1-normal(float64(k.Decode)/out, float64(r.SLO.ITL), sI))
	if math.Abs(k.Miss-own) > 1e-6 {
		t.Errorf("busy: own miss %.9f, want %.9f", k.Miss, own)
	}
	n := 50.0
	grow := float64(rt.DecodePerSeq) + (1024+out/2)*float64(rt.DecodePerMTokens)*1e-6
	after := step + grow + rt.prefillNS(1024, 0)/n
	arrivals := 10 / (256 * step) // λ: the mean batch over MeanOutput steps of it
	joiners := arrivals * float64(k.Prefill)
	pushed := normal(after, float64(r.SLO.ITL), sI) - normal(step, float64(r.SLO.ITL), sI)
	others := (10 + joiners/2) * pushed * (2*float64(r.SLO.TTFT) + n*float64(r.SLO.ITL))
	if pushed <= 0.05 {
		t.Fatalf("setup: the placement should push the batch over its bound, rise %v", pushed)
	}
	wantMisses := own*(2*float64(r.SLO.TTFT)+out*float64(r.SLO.ITL)) + others
	if got := float64(k.Misses); math.Abs(got-wantMisses) > 1e-5*wantMisses {
		t.Errorf("busy: Misses %v, want own %v + others %v", k.Misses, time.Duration(wantMisses-others), time.Duration(others))
	}
}

// normal is Φ(ln(x/bound)/sigma), the standard normal's distribution
// function by math.Erf, computed apart from the code under test.
func normal(x, bound, sigma float64) float64 {
	return (1 + math.Erf(math.Log(x/bound)/sigma/math.Sqrt2)) / 2
}

// TestKVAwareMissRefusesWhatTheSumTakes: a long prompt, and two replicas.
// a decodes 8 sequences of 30,000 tokens of context, a step of 22 ms,
// with nothing queued; b decodes little but has 32,000 prompt tokens
// queued. The sum of latencies takes a (no queue to wait for). With an
// ITL bound 20% above a's step, a's decodes, and the request's own
// answer, are likely pushed over it by the 8,000-token prefill, and the
// objective that prices misses sends it to b, whose queue costs time but
// breaks no bound.
func TestKVAwareMissRefusesWhatTheSumTakes(t *testing.T) {
	spread := Rates{Spread: 0.25, DecodeSpread: 0.25}
	s := &Snapshot{Replicas: []Replica{
		{ID: "a", Healthy: true, InFlight: 8, Decoding: 8, DecodeBlocks: 8 * 30000 / 16, CacheBlocks: 100000, Rates: spread},
		{ID: "b", Healthy: true, InFlight: 4, Decoding: 2, DecodeBlocks: 4 * 1000 / 16, PrefillTokens: 32000, CacheBlocks: 100000, Rates: spread},
	}}
	r := &Request{ID: "long", Hash: 7, Tokens: 8000, Blocks: 500, MaxTokens: 200, Pinned: -1, Costs: make([]Cost, 0, 2)}
	if d := (KVAware{}).Pick(r, s); d.Replica != 0 || d.Miss != 0 {
		t.Fatalf("without an SLO: replica %d (miss %v), want a (0), the setup's premise; costs %+v", d.Replica, d.Miss, d.Costs)
	}
	rt := Rates{}.WithDefaults()
	r.SLO = SLO{TTFT: 4 * time.Second, ITL: time.Duration(1.2 * rt.stepNS(8, 8*30000))}
	r.Costs = r.Costs[:0]
	d := KVAware{}.Pick(r, s)
	if d.Replica != 1 {
		t.Fatalf("with an SLO: replica %d, want b; costs %+v", d.Replica, d.Costs)
	}
	a, b := d.Costs[0], d.Costs[1]
	if a.Total-a.Misses >= b.Total-b.Misses {
		t.Errorf("the latency alone should still prefer a: %v vs %v", a.Total-a.Misses, b.Total-b.Misses)
	}
	if a.Miss <= b.Miss || d.Miss != b.Miss {
		t.Errorf("miss probability a %.3f, b %.3f, decision %.3f: want a's higher, the decision b's", a.Miss, b.Miss, d.Miss)
	}
}

// TestKVAwareMissCountsTheStallBeside: a long prompt, and two replicas
// decoding alike, 8 answers of 100 tokens; a has 2 s of prefill compute
// in flight (its requests' prompts), b 0.2 s and 2,000 prompt tokens
// queued. Without the work in flight, as the miss term had it, the
// decodes of both sit at their step, far under an ITL bound 10% above
// a's step plus its stall, and b's queue sends the request to a. With it,
// a's decodes already wait P/n̄ per token for the prefills beside them:
// the 8,000-token prefill pushes them over the bound, and the request
// goes to b. The others' term is exact: the batch, times the rise of
// their chance of a miss from step + stall to that plus Δ + compute/n̄,
// times their miss price.
func TestKVAwareMissCountsTheStallBeside(t *testing.T) {
	const out, n = 200, 100.0
	spread := Rates{Spread: 0.25, DecodeSpread: 0.2}
	batch := Replica{Healthy: true, InFlight: 8, Decoding: 8, DecodeBlocks: 8 * 4000 / 16, Outputs: 8, InvOutput: 8 / n,
		CacheBlocks: 100000, Rates: spread}
	a, b := batch, batch
	a.ID, b.ID, b.PrefillTokens = "a", "b", 2000
	s := &Snapshot{Replicas: []Replica{a, b}}
	rt := Rates{}.WithDefaults()
	persist := (1 - math.Exp(-out/256.0)) / (out / 256.0) // decodeLen = out / kvMeanOutput
	mean := (2*time.Second + 200*time.Millisecond).Seconds() / 2 * 1e9
	stall := func(w time.Duration) float64 { return (float64(w)*persist + mean*(1-persist)) / n }
	step := rt.stepNS(8, 8*4000)
	r := &Request{ID: "long", Hash: 7, Tokens: 8000, Blocks: 500, MaxTokens: out, Pinned: -1, Costs: make([]Cost, 0, 2),
		SLO: SLO{TTFT: 4 * time.Second, ITL: time.Duration(1.1 * (step + stall(2*time.Second)))}}
	if d := (KVAware{}).Pick(r, s); d.Replica != 0 {
		t.Fatalf("without the work in flight: replica %d, want a, the premise; costs %+v", d.Replica, d.Costs)
	}
	s.Replicas[0].PrefillWork, s.Replicas[1].PrefillWork = 2*time.Second, 200*time.Millisecond
	r.Costs = r.Costs[:0]
	d := KVAware{}.Pick(r, s)
	if d.Replica != 1 {
		t.Fatalf("with it: replica %d, want b; costs %+v", d.Replica, d.Costs)
	}
	ka := d.Costs[0]
	grow := float64(rt.DecodePerSeq) + (8000+out/2)*float64(rt.DecodePerMTokens)*1e-6
	before := step + stall(2*time.Second)
	after := before + grow + rt.prefillNS(8000, 0)/n
	pushed := normal(after, float64(r.SLO.ITL), 0.2) - normal(before, float64(r.SLO.ITL), 0.2)
	joiners := 8 / (256 * step) * float64(ka.Prefill) // λ, the mean batch over kvMeanOutput steps, times the prefill
	others := (8 + joiners/2) * pushed * (2*float64(r.SLO.TTFT) + n*float64(r.SLO.ITL))
	own := 1 - (1-normal(float64(ka.Wait+ka.Prefill), float64(r.SLO.TTFT), 0.25))*(1-normal(float64(ka.Decode)/out, float64(r.SLO.ITL), 0.2))
	want := own*(2*float64(r.SLO.TTFT)+out*float64(r.SLO.ITL)) + others
	if got := float64(ka.Misses); math.Abs(got-want) > 1e-5*want {
		t.Errorf("a: Misses %v, want own %v + others %v", ka.Misses, time.Duration(want-others), time.Duration(others))
	}
	if pushed < 0.3 {
		t.Errorf("a: the prefill should push its decodes over the bound: rise %.3f", pushed)
	}
}

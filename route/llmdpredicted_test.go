package route

import (
	"math"
	"sync"
	"testing"
	"time"
)

// TestLLMDPredictedLearnsLinear feeds the predictor observations whose
// TTFT and TPOT are exact linear functions of their features (spread
// over every bucket class by hashes) and checks it recovers the
// coefficients: within 1%
// and with no residual spread to speak of.
func TestLLMDPredictedLearnsLinear(t *testing.T) {
	wantTTFT := linear{b: 12, w: [maxFeatures]float64{
		0: 90,     // KV usage
		1: 0.01,   // tokens
		2: 25,     // waiting
		3: 2,      // in flight
		4: -30,    // cached fraction
		5: 0.04,   // uncached tokens
		6: 0.002,  // prefill tokens in flight
		7: 0.0005, // decode tokens in flight
		8: 40,     // queued
	}}
	wantTPOT := linear{b: 8, w: [maxFeatures]float64{0: 6, 1: 0.0002, 2: 0.1, 3: 0.05, 4: 0.00003, 5: 0.0001, 6: 1.5}}
	p := &LLMDPredicted{}
	for k := range 1000 {
		h := Mix64(uint64(k) + 1)
		f := Features{
			Tokens: 100 + int(h%8000),
			Cached: float64(h>>13%101) / 100,
			Serve: Load{KVUsage: float64(h>>21%100) / 100, Waiting: int(h >> 29 % 14), InFlight: int(h >> 35 % 40),
				PrefillTokens: int(h >> 41 % 20000), DecodeTokens: int(h >> 9 % 60000)},
		}
		x, y := ttftX(&f), tpotX(&f)
		p.Observe(Observation{Features: f, At: time.Duration(k) * 100 * time.Millisecond,
			TTFT: time.Duration(wantTTFT.predict(&x) * 1e6), TPOT: time.Duration(wantTPOT.predict(&y) * 1e6)})
	}
	m := p.t.model.Load()
	if m == nil {
		t.Fatal("no model after 1,000 observations")
	}
	check := func(name string, got, want linear, d int) {
		t.Helper()
		for j := range d {
			if math.Abs(got.w[j]-want.w[j]) > 0.01*math.Abs(want.w[j]) {
				t.Errorf("%s weight %d: got %.6g, want %.6g", name, j, got.w[j], want.w[j])
			}
		}
		if math.Abs(got.b-want.b) > 0.5 {
			t.Errorf("%s intercept: got %.4g ms, want %.4g", name, got.b, want.b)
		}
		if got.sigma > 0.5 {
			t.Errorf("%s residual spread: got %.3g ms, want under 0.5", name, got.sigma)
		}
	}
	check("ttft", m.ttft, wantTTFT, ttftFeatures)
	check("tpot", m.tpot, wantTPOT, tpotFeatures)
	if m.ttft.n < 900 {
		t.Errorf("ttft fitted on %d samples, want the window's ≥ 900 (the last refit)", m.ttft.n)
	}
}

// TestLLMDPredictedRetrains: before its first fit the predictor is the
// training server's default model (10 ms everywhere); it refits
// RetrainEvery after the last fit (the first: after the start) once
// MinSamples are held.
func TestLLMDPredictedRetrains(t *testing.T) {
	p := &LLMDPredicted{}
	obs := func(k int, at time.Duration) {
		p.Observe(Observation{Features: Features{Tokens: 100 * (k + 1)}, TTFT: time.Duration(k+1) * time.Millisecond, At: at})
	}
	x := ttftX(&Features{Tokens: 5000, Serve: Load{Waiting: 7}})
	if m := p.t.current(); m != &untrained || m.ttft.predict(&x) != 10 || m.tpot.predict(&x) != 10 {
		t.Fatalf("untrained: got %+v, want the default model of 10 ms", m)
	}
	for k := range 20 {
		obs(k, 9*time.Second)
	}
	if p.t.model.Load() != nil {
		t.Fatal("a model before 10 s")
	}
	obs(20, 10*time.Second)
	first := p.t.model.Load()
	if first == nil || first.ttft.n != 21 {
		t.Fatalf("at 10 s: model %+v, want one fitted on 21", first)
	}
	obs(21, 19*time.Second)
	if p.t.model.Load() != first {
		t.Error("refitted 9 s after the last fit, want 10 s")
	}
	obs(22, 20*time.Second)
	if second := p.t.model.Load(); second == first || second.ttft.n != 23 {
		t.Errorf("at 20 s: fitted on %d, want a new model on 23", second.ttft.n)
	}
	q := &LLMDPredicted{MinSamples: 5}
	for k := range 4 {
		q.Observe(Observation{TTFT: time.Millisecond, At: time.Duration(k) * 20 * time.Second})
	}
	if q.t.model.Load() != nil {
		t.Error("a model with 4 samples held, want MinSamples 5 first")
	}
}

// predicted is an LLMDPredicted whose model is TTFT = 50 ms + 100 ms per
// waiting request (of the prefilling replica) + 100 ms per waiting
// request of a leg's decode replica, and TPOT = 10 ms + 1 ms per
// request in flight; residual spread sigma ms; never exploring.
func predicted(sigma float64) *LLMDPredicted {
	p := &LLMDPredicted{Explore: -1}
	m := &latencyModel{ttft: linear{b: 50, n: 100, sigma: sigma}, tpot: linear{b: 10, n: 100, sigma: sigma}}
	m.ttft.w[2], m.ttft.w[11], m.tpot.w[3] = 100, 100, 1
	p.t.model.Store(m)
	return p
}

// waiting is a healthy replica with waiting requests and inFlight of the
// router's own.
func waiting(id string, waiting, inFlight int) Replica {
	return Replica{ID: id, Healthy: true, Scraped: true, Waiting: waiting, InFlight: inFlight}
}

// slo is a request of SLO TTFT ttftMS and TPOT tpotMS (ms), hash h.
func slo(h uint64, ttftMS, tpotMS int) *Request {
	r := rq(1024)
	r.Hash, r.SLO = h, SLO{TTFT: time.Duration(ttftMS) * time.Millisecond, ITL: time.Duration(tpotMS) * time.Millisecond}
	return r
}

// TestLLMDPredictedHeadroom: over literal snapshots, with SLO TTFT 300
// ms and TPOT 50 ms: the candidate with headroom, whichever the hash;
// with none, the idle one; with none idle, the bucket that misses TPOT
// only over the one that misses TTFT; a request without SLO as llm-d
// routes it (every headroom negative: the least predicted latency).
func TestLLMDPredictedHeadroom(t *testing.T) {
	p := predicted(0)
	cases := []struct {
		name       string
		snap       Snapshot
		ttft, tpot int
		want       int
		reason     string
	}{
		{"one meets", Snapshot{Replicas: []Replica{waiting("a", 10, 3), waiting("b", 2, 3), waiting("c", 8, 3)}}, 300, 50, 1, ReasonHeadroom},
		{"none meets, one idle", Snapshot{Replicas: []Replica{waiting("a", 3, 2), waiting("b", 8, 0)}}, 300, 50, 1, ReasonNoHeadroom},
		{"tpot-only over ttft-only", Snapshot{Replicas: []Replica{waiting("a", 4, 1), waiting("b", 0, 45)}}, 300, 50, 1, ReasonNoHeadroom},
		{"ttft-only over both", Snapshot{Replicas: []Replica{waiting("a", 4, 45), waiting("b", 4, 1)}}, 300, 50, 1, ReasonNoHeadroom},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for h := range uint64(50) {
				d := p.Pick(slo(h, tc.ttft, tc.tpot), &tc.snap)
				if d.Replica != tc.want || d.Reason != tc.reason {
					t.Fatalf("hash %d: got %d (%s), want %d (%s)", h, d.Replica, d.Reason, tc.want, tc.reason)
				}
			}
		})
	}
}

// TestLLMDPredictedPacks: of candidates that all meet the SLO, "least"
// packs onto the one closest to it (scores 1.01 against 0.01 and 0.51:
// 1.01/1.53 of draws) and never onto none; without an SLO the least
// predicted latency wins as often; untrained, every prediction is 10 ms,
// the scores tie and the draw is uniform.
func TestLLMDPredictedPacks(t *testing.T) {
	snap := Snapshot{Replicas: []Replica{waiting("a", 0, 3), waiting("b", 2, 3), waiting("c", 1, 3)}}
	count := func(p *LLMDPredicted, ttft, tpot int) (n [3]int, reasons map[string]int) {
		reasons = map[string]int{}
		for h := range uint64(2000) {
			d := p.Pick(slo(Mix64(h), ttft, tpot), &snap)
			n[d.Replica]++
			reasons[d.Reason]++
		}
		return n, reasons
	}
	n, reasons := count(predicted(0), 300, 50)
	if f := float64(n[1]) / 2000; math.Abs(f-1.01/1.53) > 0.04 || reasons[ReasonHeadroom] != 2000 {
		t.Errorf("with SLO: picks %v, reasons %v; want b about %.2f of them, all by headroom", n, reasons, 1.01/1.53)
	}
	n, reasons = count(predicted(0), 0, 0)
	if f := float64(n[0]) / 2000; math.Abs(f-1.01/1.53) > 0.04 || reasons[ReasonNoHeadroom] != 2000 {
		t.Errorf("no SLO: picks %v, reasons %v; want a about %.2f of them", n, reasons, 1.01/1.53)
	}
	n, reasons = count(&LLMDPredicted{}, 300, 50)
	for i := range n {
		if f := float64(n[i]) / 2000; math.Abs(f-1.0/3) > 0.04 || reasons[ReasonHeadroom] != 2000 {
			t.Errorf("untrained: picks %v, reasons %v; want a third each, all by headroom", n, reasons)
		}
	}
}

// TestLLMDPredictedExplores: where one candidate meets the SLO and one
// does not, about 1% of requests explore the one that does not.
func TestLLMDPredictedExplores(t *testing.T) {
	p := predicted(0)
	p.Explore = 0
	snap := Snapshot{Replicas: []Replica{waiting("a", 10, 3), waiting("b", 2, 3)}}
	n := 0
	for h := range uint64(20000) {
		if p.Pick(slo(Mix64(h), 300, 50), &snap).Replica == 0 {
			n++
		}
	}
	if f := float64(n) / 20000; math.Abs(f-0.01) > 0.003 {
		t.Errorf("explored %.4f of requests, want about 0.01", f)
	}
}

// TestLLMDPredictedMiss: Decision.Miss is the normal tail beyond the
// bound: predicted TTFT 250 ms, residual spread 50 ms, SLO 300 ms:
// P(TTFT > 300) = Q(1) = 0.1587; TPOT 13 ms against 50 ms adds
// Q(37/50 ms) = 0.2296: 1 − (1 − 0.1587)(1 − 0.2296) = 0.3518.
func TestLLMDPredictedMiss(t *testing.T) {
	p := predicted(50)
	d := p.Pick(slo(1, 300, 50), &Snapshot{Replicas: []Replica{waiting("a", 2, 3)}})
	want := 1 - (1-0.5*math.Erfc(1/math.Sqrt2))*(1-0.5*math.Erfc(37.0/50/math.Sqrt2))
	if math.Abs(d.Miss-want) > 1e-12 {
		t.Errorf("miss: got %.6f, want %.6f", d.Miss, want)
	}
}

// TestLLMDPredictedPair: on a fleet with prefill workers w0 (idle) and
// w1 (5 waiting) and decode replicas d0 (idle) and d1 (5 waiting), a
// request with SLO TTFT 300 ms (270 buffered) takes the only pair that
// meets it, w0 → d0, its predicted TTFT 50 + 5 ms; without an SLO, each
// profile picks by least predicted latency and the prompt prefills
// remotely too.
func TestLLMDPredictedPair(t *testing.T) {
	p := predicted(0)
	worker := func(id string, waiting int) Replica {
		return Replica{ID: id, Role: RolePrefill, Prefills: true, Scraped: true, Waiting: waiting}
	}
	snap := Snapshot{Replicas: []Replica{worker("w0", 0), worker("w1", 5), waiting("d0", 0, 1), waiting("d1", 5, 1)}}
	for h := range uint64(50) {
		d := p.Pick(slo(h, 300, 50), &snap)
		if d.Replica != 2 || d.Transfer.From != 0 || d.Transfer.Blocks != 1023/16 || d.Reason != ReasonDisagg || d.Miss != 0 {
			t.Fatalf("hash %d: got %+v, want decode 2, leg on 0 of 63 blocks, reason disagg, miss 0", h, d)
		}
		f := p.Features(slo(h, 300, 50), &snap, d)
		if !f.Leg || f.Prefill.Waiting != 0 || f.Serve.InFlight != 1 {
			t.Fatalf("hash %d: features %+v, want a leg from w0 to d0", h, f)
		}
	}
	d := p.Pick(slo(3, 0, 0), &snap)
	if d.Transfer.Blocks == 0 || d.Reason != ReasonDisagg {
		t.Errorf("no SLO: got %+v, want a prefill leg", d)
	}
}

// TestLLMDPredictedPickAllocatesNothing: with a model, by headroom and by
// pairs, a Pick allocates nothing (TestPickAllocatesNothing covers the
// untrained policy).
func TestLLMDPredictedPickAllocatesNothing(t *testing.T) {
	p := predicted(10)
	r, s := benchFleet(64)
	r.SLO = SLO{TTFT: 300 * time.Millisecond, ITL: 50 * time.Millisecond}
	if n := testing.AllocsPerRun(100, func() { r.Hash++; p.Pick(r, s) }); n != 0 {
		t.Errorf("aggregated: got %v allocs per Pick, want 0", n)
	}
	for i := range 8 {
		s.Replicas[i].Role, s.Replicas[i].Prefills, s.Replicas[i].Healthy = RolePrefill, true, false
	}
	if n := testing.AllocsPerRun(100, func() { r.Hash++; p.Pick(r, s) }); n != 0 {
		t.Errorf("pairs: got %v allocs per Pick, want 0", n)
	}
}

// TestLLMDPredictedConcurrent: the proxy's request goroutines observe
// while others pick (run it with -race); every observation is held.
func TestLLMDPredictedConcurrent(t *testing.T) {
	p := &LLMDPredicted{}
	snap := Snapshot{Replicas: []Replica{waiting("a", 1, 2), waiting("b", 3, 1)}}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for k := range 200 {
				p.Observe(Observation{Features: Features{Tokens: 100 + k, Serve: Load{Waiting: g}},
					TTFT: time.Duration(10+k) * time.Millisecond, TPOT: 5 * time.Millisecond, At: time.Duration(k) * 100 * time.Millisecond})
			}
		})
	}
	for g := range 2 {
		wg.Go(func() {
			for k := range 200 {
				if d := p.Pick(slo(uint64(g*1000+k), 300, 50), &snap); d.Replica < 0 {
					t.Errorf("pick %d: no replica", k)
				}
			}
		})
	}
	wg.Wait()
	if p.t.held != 800 {
		t.Errorf("held %d samples, want 800", p.t.held)
	}
}

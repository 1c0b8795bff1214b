package fleet

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/scrape"
)

func TestCalibratorConverges(t *testing.T) {
	tests := []struct {
		name      string
		cal       Calibrator
		predicted time.Duration
		observed  time.Duration
		n         int
		want      float64
	}{
		{"twice as slow", Calibrator{}, 100 * time.Millisecond, 200 * time.Millisecond, 50, 2},
		{"faster than predicted", Calibrator{}, 100 * time.Millisecond, 50 * time.Millisecond, 50, 0.5},
		{"exact model", Calibrator{}, 80 * time.Millisecond, 80 * time.Millisecond, 10, 1},
		{"clamped high", Calibrator{}, time.Millisecond, 2 * time.Second, 50, 1024},
		{"clamped low", Calibrator{}, 2 * time.Second, time.Millisecond, 50, 1.0 / 1024},
		{"20x faster (--time-scale 0.05)", Calibrator{}, 100 * time.Millisecond, 5 * time.Millisecond, 50, 0.05},
		{"1000x faster (--time-scale 0.001)", Calibrator{}, 100 * time.Millisecond, 100 * time.Microsecond, 50, 0.001},
		{"500x slower", Calibrator{}, 10 * time.Millisecond, 5 * time.Second, 50, 500},
		{"clamped by custom max", Calibrator{Max: 1.5}, 10 * time.Millisecond, 20 * time.Millisecond, 50, 1.5},
		{"tiny predictions ignored", Calibrator{}, 100 * time.Microsecond, 10 * time.Millisecond, 50, 1},
		{"no observation", Calibrator{}, time.Second, time.Second, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.cal
			for range tt.n {
				c.Observe(tt.predicted, tt.observed)
			}
			if got := c.Scale(); math.Abs(got-tt.want) > 1e-9 {
				t.Errorf("Scale = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestCalibratorTracksChange checks that after a regime change the scale
// moves toward the new ratio with the EWMA weight, and ignores one outlier.
func TestCalibratorTracksChange(t *testing.T) {
	var c Calibrator
	for range 100 {
		c.Observe(100*time.Millisecond, 100*time.Millisecond)
	}
	c.Observe(100*time.Millisecond, 10*time.Second) // one outlier, clamped to 4× the scale (Jump)
	if got := c.Scale(); got > 1.15 {
		t.Errorf("after one outlier: Scale %v, want <= 1.15 (4^0.1)", got)
	}
	for range 60 {
		c.Observe(100*time.Millisecond, 300*time.Millisecond)
	}
	if got := c.Scale(); math.Abs(got-3) > 0.01 {
		t.Errorf("after 60 observations at 3x: Scale %v, want ~3", got)
	}
}

// TestTicketCalibrates: a streamed request of a policy whose costs predict
// TTFT calibrates its replica's scale from the time between the decision
// and the first token; a request whose TTFT is not observed does not, and
// the uncalibrated replicas take the calibrated ones' mean scale and
// their spread (calTotals.prior), not the wider route.PriorSpread.
func TestTicketCalibrates(t *testing.T) {
	f := newFleet(t, Config{Policy: route.KVAware{}})
	var sc Scratch
	var want float64
	for i := range 30 {
		now := t0.Add(time.Duration(i) * time.Second)
		req := &Request{ID: fmt.Sprint(i), Tokens: 2000, MaxTokens: 10, TTFT: true}
		d, tk := f.Decide(req, []int{1, 2}, now, &sc)
		if d.Replica != 0 {
			t.Fatalf("decision %d: replica %d, want 0", i, d.Replica)
		}
		pred := tk.Claim().PredictedTTFT
		if pred <= 0 {
			t.Fatalf("no predicted TTFT in the claim")
		}
		tk.FirstToken(now.Add(pred * 3 / 2))
		tk.Done(now, NoUsage, nil)
		want = 1.5
	}
	var s route.Snapshot
	f.Snapshot(&s, t0, 0)
	for i, r := range s.Replicas {
		if math.Abs(r.Rates.Scale-want) > 1e-3 {
			t.Errorf("replica %d: Scale %v, want %v (calibrated, or the calibrated mean)", i, r.Rates.Scale, want)
		}
		if sp := s.Replicas[0].Rates.Spread; !(sp > 0 && sp < route.PriorSpread) || r.Rates.Spread != sp {
			t.Errorf("replica %d: Spread %v, replica 0's %v: want replica 0's, learned below the prior %v", i, r.Rates.Spread, sp, route.PriorSpread)
		}
	}
	// The next streamed request is priced at the learned scale: its
	// calibrated prediction is the policy's Wait + Prefill, 1.5 times the
	// one at scale 1 the calibration observes against.
	d, tk := f.Decide(&Request{ID: "y", Tokens: 2000, MaxTokens: 10, TTFT: true}, []int{1, 2}, t0, &sc)
	c := tk.Claim()
	var priced time.Duration
	for _, k := range d.Costs {
		if k.Replica == d.Replica {
			priced = k.Wait + k.Prefill
		}
	}
	if priced <= 0 || absDur(c.CalibratedTTFT()-priced) > time.Microsecond ||
		absDur(c.CalibratedTTFT()-time.Duration(float64(c.PredictedTTFT)*want)) > time.Microsecond {
		t.Errorf("CalibratedTTFT %v, PredictedTTFT %v, policy's Wait+Prefill %v: want CalibratedTTFT = Wait+Prefill = PredictedTTFT × %v",
			c.CalibratedTTFT(), c.PredictedTTFT, priced, want)
	}
	tk.Done(t0, NoUsage, nil)
	_, tk = f.Decide(&Request{ID: "x", Tokens: 2000}, nil, t0, &sc)
	if got := tk.Claim().PredictedTTFT; got != 0 {
		t.Errorf("a request whose TTFT is not observed predicted %v, want 0", got)
	}
	if got := tk.Claim().CalibratedTTFT(); got != 0 {
		t.Errorf("a request whose TTFT is not observed: CalibratedTTFT %v, want 0", got)
	}
}

func absDur(d time.Duration) time.Duration { return max(d, -d) }

func TestChurnHorizon(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	load := func(sec float64, queries, hits float64) scrape.Load {
		return scrape.Load{BlockSize: 16, NumBlocks: 6250, PrefixQueries: queries, PrefixHits: hits,
			At: t0.Add(time.Duration(sec * float64(time.Second)))}
	}
	tests := []struct {
		name  string
		loads []scrape.Load
		want  time.Duration
	}{
		{"no data", nil, 0},
		{"one reading", []scrape.Load{load(0, 0, 0)}, 0},
		// 100,000 tokens of capacity, 1,000 missed tokens per second.
		{"steady misses", []scrape.Load{load(0, 0, 0), load(1, 3000, 2000), load(2, 6000, 4000)}, 100 * time.Second},
		{"short spans accumulate", []scrape.Load{load(0, 0, 0), load(0.5, 1000, 500), load(1, 2000, 1000)}, 100 * time.Second},
		{"all hits", []scrape.Load{load(0, 0, 0), load(1, 5000, 5000)}, 0},
		{"counter reset restarts", []scrape.Load{load(0, 9000, 0), load(1, 10, 0), load(2, 1010, 0)}, 100 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c Churn
			for _, l := range tt.loads {
				c.Observe(l)
			}
			if got := c.Horizon(); got != tt.want {
				t.Errorf("Horizon = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestTicketCalibratesDecode: a streamed request that completed with at
// least 2 output tokens calibrates its replica's DecodeScale with its
// decode span against route.Rates.StepTime (batch: the replica's decoding
// requests; context: batch × prompt plus half the output), net of the
// prefills that finished there meanwhile; the uncalibrated replicas take
// the calibrated one's scale (priorScale); a request not streamed, with
// one output token, or failed, does not calibrate.
func TestTicketCalibratesDecode(t *testing.T) {
	preset := route.Rates{DecodeStep: 10 * time.Millisecond, DecodePerSeq: 100 * time.Microsecond,
		DecodePerMTokens: 50 * time.Millisecond, PrefillPerToken: 50 * time.Microsecond}
	rt := preset.WithDefaults()
	pred := rt.StepTime(1, 1000+50) // 10 ms + 0.1 ms + 1050 × 50 ns
	if want := 10*time.Millisecond + 100*time.Microsecond + 52500*time.Nanosecond; pred != want {
		t.Fatalf("StepTime = %v, want %v", pred, want)
	}
	tests := []struct {
		name   string
		claim  Claim
		tokens int
		err    error
		other  int           // prefill tokens of another request that finished meanwhile
		want   float64       // DecodeScale of replica a after
		span   time.Duration // observed decode span, before the other's prefill
	}{
		{"streamed", Claim{Streamed: true, PromptTokens: 1000}, 101, nil, 0, 1.5, 150 * pred},
		{"prefill meanwhile is not decode", Claim{Streamed: true, PromptTokens: 1000}, 101, nil, 2000, 1.5, 150 * pred},
		{"not streamed", Claim{PromptTokens: 1000}, 101, nil, 0, 1, 150 * pred},
		{"one token", Claim{Streamed: true, PromptTokens: 1000}, 1, nil, 0, 1, 150 * pred},
		{"failed", Claim{Streamed: true, PromptTokens: 1000}, 101, errors.New("cut"), 0, 1, 150 * pred},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFleet(t, Config{Rates: preset})
			tk, _ := f.Acquire(a, tt.claim, t0)
			first := t0.Add(time.Second)
			tk.FirstToken(first)
			span := tt.span
			if tt.other > 0 { // its prefill ran in tk's iterations
				o, _ := f.Acquire(a, Claim{PrefillTokens: tt.other}, first)
				o.FirstToken(first.Add(time.Millisecond))
				o.Done(first.Add(time.Millisecond), NoUsage, errors.New("leaves no decode"))
				span += time.Duration(tt.other) * preset.PrefillPerToken
				span += time.Duration(float64(tt.other) * float64(tt.other) / 2 * float64(route.DefaultAttnPerMPairs) / 1e6)
			}
			tk.Done(first.Add(span), Usage{PromptTokens: 1000, CachedTokens: 0, CompletionTokens: tt.tokens}, tt.err)
			var s route.Snapshot
			f.Snapshot(&s, first, 0)
			for i, r := range s.Replicas { // b and c take a's as their prior
				if math.Abs(r.Rates.DecodeScale-tt.want) > 1e-3 {
					t.Errorf("replica %d: DecodeScale %v, want %v", i, r.Rates.DecodeScale, tt.want)
				}
			}
		})
	}
}

// TestNearHitsDoNotCalibrate: a near-full hit whose first token comes 3×
// later than predicted (it waited for an iteration, or loaded its prefix
// from a CPU tier the router did not know of) says nothing of how fast
// the replica computes: its compute is a sliver of the prediction, and
// Scale stays 1. A cold prefill 1.5× slower than predicted is computing,
// and sets it.
func TestNearHitsDoNotCalibrate(t *testing.T) {
	f := newFleet(t, Config{Replicas: reps(a)})
	observe := func(cached int, slowdown float64) {
		c := Claim{PrefillTokens: 7200 - cached, PredictedCached: cached, PromptTokens: 7200, Tokens: 7300, Streamed: true}
		compute := f.preset.PrefillTime(7200-cached, cached)
		c.PredictedTTFT = compute + 10*time.Millisecond // an iteration, say
		tk, err := f.Acquire(a, c, t0)
		if err != nil {
			t.Fatal(err)
		}
		tk.FirstToken(t0.Add(time.Duration(float64(c.PredictedTTFT) * slowdown)))
		tk.Done(t0.Add(time.Second), Usage{PromptTokens: 7200, CachedTokens: cached, CompletionTokens: 1}, nil)
	}
	scale := func() float64 {
		var s route.Snapshot
		f.Snapshot(&s, t0, 16)
		return s.Replicas[0].Rates.Scale
	}
	for range 20 {
		observe(7184, 3)
	}
	if got := scale(); got != 1 {
		t.Errorf("after near-full hits 3× slow: Scale %.3f, want 1", got)
	}
	for range 20 {
		observe(0, 1.5)
	}
	if got := scale(); math.Abs(got-1.5) > 0.01 {
		t.Errorf("after cold prefills 1.5× slow: Scale %.3f, want 1.5", got)
	}
}

// TestChurnHorizonFromHistory: 100,000 tokens of free cache, allocated at
// 1,000 tokens a second for 200 s and then at 10,000 for 2 s. LRU's
// horizon is how long ago the free part began to be allocated anew: the
// burst's 20,000 tokens and the 80 s before it. A smoothed rate would
// follow the burst to a horizon of a fifth of that.
func TestChurnHorizonFromHistory(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var c Churn
	misses := 0.0
	at := func(sec int) scrape.Load {
		return scrape.Load{BlockSize: 16, NumBlocks: 6250, PrefixQueries: misses, At: t0.Add(time.Duration(sec) * time.Second)}
	}
	c.Observe(at(0))
	for s := 1; s <= 200; s++ {
		misses += 1000
		c.Observe(at(s))
	}
	if got := c.Horizon(); absDur(got-100*time.Second) > time.Second {
		t.Errorf("steady: Horizon %v, want 100s", got)
	}
	for s := 201; s <= 202; s++ {
		misses += 10000
		c.Observe(at(s))
	}
	if got := c.Horizon(); absDur(got-82*time.Second) > time.Second {
		t.Errorf("after the burst: Horizon %v, want 82s (the smoothed rate's: %.0fs)", got, c.capacity*c.free/c.rate)
	}
}

// TestChurnTierHorizon: a write-through CPU tier of 400,000 tokens behind
// a GPU cache of 100,000 takes the GPU's new blocks less those it served
// itself (the external prefix-cache hits, which the GPU counts as
// misses): 1,000 missed tokens a second of which 600 loaded from the
// tier leave 400 a second new to it, a horizon of 1,000 s; without a
// tier there is none.
func TestChurnTierHorizon(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	load := func(sec float64, cpuBlocks int, queries, hits, external float64) scrape.Load {
		return scrape.Load{BlockSize: 16, NumBlocks: 6250, CPUBlocks: cpuBlocks, PrefixQueries: queries, PrefixHits: hits,
			ExternalHits: external, At: t0.Add(time.Duration(sec * float64(time.Second)))}
	}
	var c Churn
	for _, l := range []scrape.Load{load(0, 25000, 0, 0, 0), load(1, 25000, 3000, 2000, 600), load(2, 25000, 6000, 4000, 1200)} {
		c.Observe(l)
	}
	if got, want := c.Horizon(), 100*time.Second; got != want {
		t.Errorf("Horizon = %v, want %v", got, want)
	}
	if got, want := c.TierHorizon(), 1000*time.Second; got != want {
		t.Errorf("TierHorizon = %v, want %v", got, want)
	}
	var none Churn
	for _, l := range []scrape.Load{load(0, 0, 0, 0, 0), load(1, 0, 3000, 2000, 0)} {
		none.Observe(l)
	}
	if got := none.TierHorizon(); got != 0 {
		t.Errorf("without a tier TierHorizon = %v, want 0", got)
	}
}

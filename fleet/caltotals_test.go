package fleet

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestShrinkTakesNoiseNotSpeed: eight equal replicas learn their scale
// from 60 ratios each, noisy by 20% (log-normal), and so spread over
// several percent. Shrunk towards the pool, they agree within 1%. A ninth,
// truly twice as slow, lies outside what their spread and its noise
// explain: it keeps its own within 3%, and stays out of the pool, so
// that the eight still agree within 1% (with it in, its spread would
// read as theirs and they would spread over 12% again).
func TestShrinkTakesNoiseNotSpeed(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var pool calTotals
	cals := make([]Calibrator, 9)
	shares := make([]share, 9)
	truth := func(i int) float64 {
		if i == 8 {
			return 2
		}
		return 1
	}
	for range 60 {
		for i := range cals {
			ratio := truth(i) * math.Exp(0.2*rng.NormFloat64())
			cals[i].Observe(time.Second, time.Duration(ratio*float64(time.Second)))
		}
	}
	raw, shrunk := make([]float64, 9), make([]float64, 9)
	pass := func(n int) {
		for range 2 { // the second pass sees every replica pooled
			for i := range n {
				raw[i], shrunk[i] = cals[i].Scale(), shares[i].set(&pool, &cals[i])
			}
		}
	}
	pass(8)
	spread := func(xs []float64) float64 {
		lo, hi := xs[0], xs[0]
		for _, x := range xs {
			lo, hi = min(lo, x), max(hi, x)
		}
		return hi/lo - 1
	}
	if s := spread(raw[:8]); s < 0.03 {
		t.Fatalf("the equal replicas' own scales spread %.1f%%: too little noise to test", 100*s)
	}
	if s := spread(shrunk[:8]); s > 0.01 {
		t.Errorf("the equal replicas' shrunk scales spread %.1f%% (own %.1f%%), want ≤ 1%%", 100*s, 100*spread(raw[:8]))
	}
	pass(9)
	if d := math.Abs(shrunk[8]/raw[8] - 1); d > 0.03 {
		t.Errorf("the slow replica's shrunk scale %.3f is %.1f%% from its own %.3f, want ≤ 3%%", shrunk[8], 100*d, raw[8])
	}
	if s := spread(shrunk[:8]); s > 0.01 {
		t.Errorf("beside the slow replica the equal replicas' shrunk scales spread %.1f%%, want ≤ 1%%", 100*s)
	}
	if pool.n != 8 {
		t.Errorf("%d replicas pooled, want the 8 equal ones", pool.n)
	}
	// Dropped, a replica leaves the pool: a lone one keeps its own.
	for i := 1; i < 9; i++ {
		shares[i].set(&pool, nil)
	}
	if got := shares[0].set(&pool, &cals[0]); got != cals[0].Scale() {
		t.Errorf("alone, scale %.4f, want its own %.4f", got, cals[0].Scale())
	}
}

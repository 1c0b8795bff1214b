package route

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestMissTailBounds holds what pruning's cheap bounds promise (bound,
// kvprune.go): lowOver ≤ over ≤ highOver and lowLog ≤ ln ≤ highLog,
// over random arguments near and far from the bound and over the special
// values, so that a candidate they price out or in, the exact tail would
// too, and the decisions stay those of full pricing.
func TestMissTailBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	special := []float64{0, -1, 0x1p-1074, 0x1p-1022, 1, math.MaxFloat64, math.Inf(1), math.NaN()}
	check := func(pred, logBound, sigma float64) {
		t.Helper()
		lo, ex, hi := lowOver(pred, logBound, sigma), over(pred, logBound, sigma), highOver(pred, logBound, sigma)
		if math.IsNaN(ex) {
			return // nothing is priced on a NaN: both bounds pass it on
		}
		if !(lo <= ex && ex <= hi) {
			t.Fatalf("over(%g, %g, %g) = %g, bounds %g..%g", pred, logBound, sigma, ex, lo, hi)
		}
	}
	for range 200_000 {
		bound := math.Exp(rng.NormFloat64() * 5)
		// Around the bound (z near 0) most often, then anywhere.
		pred := bound * math.Exp(rng.NormFloat64()*0.5)
		if rng.IntN(4) == 0 {
			pred = math.Exp(rng.NormFloat64() * 30)
		}
		sigma := 0.01 + rng.Float64()*2
		check(pred, math.Log(bound), sigma)
		if x := pred; x >= 0x1p-1022 && x <= math.MaxFloat64 {
			if l := math.Log(x); !(lowLog(x) <= l && l <= highLog(x)) {
				t.Fatalf("ln %g = %g, bounds %g..%g", x, l, lowLog(x), highLog(x))
			}
		}
	}
	for _, p := range special {
		for _, b := range special {
			if b > 0 {
				check(p, math.Log(b), 0.5)
			}
		}
	}
}

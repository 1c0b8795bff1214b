package route

import (
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// TestSummaryKeptAsDerived: a Summary kept by Update through a seeded
// mix of changes (counts, scraped metrics and their age, health, scales,
// a second preset coming and going) summarises the snapshot as a fresh
// one does, and kv-aware decides on it as on a snapshot without one,
// pruned (above kvPruneAbove replicas) and not.
func TestSummaryKeptAsDerived(t *testing.T) {
	for _, n := range []int{8, kvPruneAbove + 36} {
		rng := rand.New(rand.NewPCG(11, uint64(n)))
		r, s := benchFleet(n)
		kept := NewSummary(0)
		kept.Reset(n)
		for i := range n {
			kept.Update(s, i)
		}
		other := Rates{PrefillPerToken: 2 * DefaultPrefillPerToken, MaxSeqs: 64}
		for step := range 400 {
			i := rng.IntN(n)
			rp := &s.Replicas[i]
			switch rng.IntN(6) {
			case 0:
				rp.InFlight, rp.PrefillTokens, rp.DecodeBlocks = rng.IntN(40), rng.IntN(9000), rng.IntN(20000)
			case 1:
				rp.Running, rp.KVUsage, rp.Scraped = rng.IntN(40), rng.Float64(), rng.IntN(4) > 0
			case 2:
				rp.LoadAge = time.Duration(rng.IntN(2000)) * time.Millisecond
			case 3:
				rp.Healthy = !rp.Healthy
			case 4:
				rp.Rates.Scale, rp.Rates.DecodeScale = 0.5+rng.Float64(), 0.5+rng.Float64()
			case 5:
				if rp.Rates.PrefillPerToken == 0 {
					rp.Rates.PrefillPerToken, rp.Rates.MaxSeqs = other.PrefillPerToken, other.MaxSeqs
				} else {
					rp.Rates.PrefillPerToken, rp.Rates.MaxSeqs = 0, 0
				}
			}
			kept.Update(s, i)
			if err := kept.Check(s); err != nil {
				t.Fatalf("%d replicas, step %d: %v", n, step, err)
			}
			r.Seq++
			s.Summary = kept
			got := KVAware{}.Pick(r, s)
			got.Costs = append([]Cost(nil), got.Costs...)
			s.Summary = nil
			want := KVAware{}.Pick(r, s)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%d replicas, step %d: on the kept summary %+v, derived %+v", n, step, got, want)
			}
		}
	}
}

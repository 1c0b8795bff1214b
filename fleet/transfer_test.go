package fleet

import (
	"slices"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
)

// settledProbe sends every request to replica 0 and keeps the
// Request.Settled each decision saw.
type settledProbe struct{ seen [][]int }

func (p *settledProbe) Pick(r *route.Request, s *route.Snapshot) route.Decision {
	p.seen = append(p.seen, slices.Clone(r.Settled))
	return route.Decision{Replica: 0, Reason: "test"}
}

func (*settledProbe) Needs() route.Needs { return route.Needs{Index: route.Approximate} }

// TestSettledWhilePrefilling: with transfers on, a request sent to a
// replica computes the prompt's blocks past what the index matched there,
// and until its first token those are not settled on it (no peer could
// import them): a second request for the same prefix sees Settled[0] = 0
// though the index matches all 20 blocks there. Once the first token is
// out they are settled (Settled nil). A request extending the prompt by
// 10 blocks computes only those: the next one sees the first 20 settled.
// Without transfers nothing is kept.
func TestSettledWhilePrefilling(t *testing.T) {
	chain := func(n int) []residency.Chain {
		c := residency.Chain{Tokens: 16, Hashes: make([]prefix.Hash, n)}
		for i := range c.Hashes {
			c.Hashes[i] = prefix.Hash(1000 + i)
		}
		return []residency.Chain{c}
	}
	for _, transfers := range []bool{true, false} {
		p := &settledProbe{}
		cfg := Config{Replicas: reps(a, b), Policy: p, BlockSize: 16}
		if transfers {
			cfg.Rates.TransferPerMTokens = 2600 * time.Microsecond
		}
		f := newFleet(t, cfg)
		var sc Scratch
		send := func(blocks int) *Ticket {
			t.Helper()
			_, tk := f.Decide(&Request{ID: "r", Hash: 1, Tokens: blocks * 16, MaxTokens: 10, Chains: chain(blocks)}, nil, t0, &sc)
			if tk == nil {
				t.Fatal("no ticket")
			}
			return tk
		}
		first := send(20)
		second := send(20)
		first.FirstToken(t0)
		second.FirstToken(t0)
		send(20).FirstToken(t0)
		longer := send(30)
		send(30)
		longer.Done(t0, NoUsage, nil)
		send(30)
		want := [][]int{nil, {0, 0}, nil, nil, {20, 0}, nil}
		if !transfers {
			want = [][]int{nil, nil, nil, nil, nil, nil}
		}
		if !slices.EqualFunc(p.seen, want, slices.Equal[[]int]) {
			t.Errorf("transfers %v: Settled seen %v, want %v", transfers, p.seen, want)
		}
	}
}

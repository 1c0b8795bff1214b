package fleet

import (
	"errors"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
)

// holdProbe reads the approximate index and sends request "q" to replica
// 0, every other to replica 1.
type holdProbe struct{}

func (holdProbe) Pick(r *route.Request, _ *route.Snapshot) route.Decision {
	if r.ID == "q" {
		return route.Decision{Replica: 0, Reason: "test"}
	}
	return route.Decision{Replica: 1, Reason: "test"}
}
func (holdProbe) Needs() route.Needs { return route.Needs{Index: route.Approximate} }

// TestHeldPromptAgesFromItsEnd: a request's prompt, matched by later
// requests on its replica, reads age 0 while the request is in flight
// however long ago it was routed (the engine cannot evict it), and from
// its end on ages from there, whether it completed or failed.
func TestHeldPromptAgesFromItsEnd(t *testing.T) {
	hashes := make([]prefix.Hash, 8)
	for k := range hashes {
		hashes[k] = prefix.Hash(100 + k)
	}
	chains := []residency.Chain{{Tokens: 16, Hashes: hashes}}
	for _, err := range []error{nil, errors.New("502")} {
		f := newFleet(t, Config{Policy: holdProbe{}})
		var sc Scratch
		probe := func(at time.Duration) (int, time.Duration) {
			t.Helper()
			_, tk := f.Decide(&Request{ID: "probe", Tokens: 128, Chains: chains}, nil, t0.Add(at), &sc)
			if tk == nil {
				t.Fatal("probe rejected")
			}
			tk.Done(t0.Add(at), NoUsage, nil)
			return sc.Request.Match[0], sc.Request.Age[0]
		}
		_, q := f.Decide(&Request{ID: "q", Tokens: 128, Chains: chains}, nil, t0.Add(10*time.Second), &sc)
		if m, age := probe(70 * time.Second); m != 8 || age != 0 {
			t.Errorf("err %v: in flight since 10s, at 70s: match %d age %v, want 8 0s", err, m, age)
		}
		q.Done(t0.Add(80*time.Second), Usage{PromptTokens: 128, CachedTokens: 0, CompletionTokens: 1000}, err)
		if m, age := probe(100 * time.Second); m != 8 || age != 20*time.Second {
			t.Errorf("err %v: ended at 80s, at 100s: match %d age %v, want 8 20s", err, m, age)
		}
	}
}

package route_test

import (
	"testing"

	"github.com/kvrouter/kvrouter/route"
)

// pdFleet is two prefill workers, the second with less queued, and two
// decode replicas, the first caching the request's first match blocks.
func pdFleet(tokens, match int) (*route.Request, *route.Snapshot) {
	s := &route.Snapshot{BlockSize: 16, Replicas: []route.Replica{
		{ID: "p0", Role: route.RolePrefill, Prefills: true, PrefillTokens: 5000},
		{ID: "p1", Role: route.RolePrefill, Prefills: true, PrefillTokens: 100},
		{ID: "d0", Role: route.RoleDecode, Healthy: true},
		{ID: "d1", Role: route.RoleDecode, Healthy: true, InFlight: 3, DecodeBlocks: 300},
	}}
	r := &route.Request{ID: "r", Hash: 7, Tokens: tokens, MaxTokens: 64, Blocks: tokens / 16, Match: []int{0, 0, match, 0}, Pinned: -1}
	return r, s
}

// The peers' P/D schedulers, on literal snapshots: dynamo-pd prefills
// remotely exactly when the prompt's part uncached on the decode worker
// it picked exceeds 1,000 tokens, on the least-queued prefill worker;
// pd-round-robin and llm-d-pd (nonCachedTokens 0) always do. Remotely,
// the decision sends every block but the last token's and predicts them
// cached on the decode replica. Without prefill workers each is its base
// policy.
func TestPDPeers(t *testing.T) {
	for _, c := range []struct {
		policy        string
		tokens, match int
		remote        bool
	}{
		{"dynamo-pd", 1000, 0, false},
		{"dynamo-pd", 1024, 0, true},
		{"dynamo-pd", 3000, 125, false}, // 1,000 uncached after the 2,000 cached
		{"dynamo-pd", 3008, 125, true},
		{"pd-round-robin", 64, 0, true},
		{"llm-d-pd", 64, 0, true},
	} {
		p, err := route.New(c.policy)
		if err != nil {
			t.Fatal(err)
		}
		r, s := pdFleet(c.tokens, c.match)
		d := p.Pick(r, s)
		if d.Replica < 2 {
			t.Fatalf("%s: decode replica %d, want a decode replica", c.policy, d.Replica)
		}
		remote := d.Transfer.Blocks > 0
		if remote != c.remote {
			t.Errorf("%s, %d tokens, %d cached: remote %v, want %v (%+v)", c.policy, c.tokens, c.match*16, remote, c.remote, d)
			continue
		}
		if !remote {
			continue
		}
		if want := (c.tokens - 1) / 16; d.Transfer.Blocks != want || d.Matched != want*16 || d.Reason != route.ReasonDisagg {
			t.Errorf("%s: %+v, want %d blocks sent, predicted cached, reason disagg", c.policy, d, want)
		}
		if c.policy == "dynamo-pd" && d.Transfer.From != 1 {
			t.Errorf("dynamo-pd: prefill worker %d, want the least queued (1)", d.Transfer.From)
		}
	}
	for name, base := range map[string]string{"dynamo-pd": "dynamo-kv", "llm-d-pd": "llm-d", "pd-round-robin": "round-robin"} {
		p, _ := route.New(name)
		b, _ := route.New(base)
		r, s := pdFleet(3000, 0)
		s.Replicas = s.Replicas[2:]
		r.Match = r.Match[2:]
		if got, want := p.Pick(r, s), b.Pick(r, s); got.Replica != want.Replica || got.Transfer != want.Transfer {
			t.Errorf("%s on an aggregated fleet: %+v, %s: %+v", name, got, base, want)
		}
	}
}

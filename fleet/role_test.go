package fleet

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
)

// A prefill worker is never a candidate (Healthy false, so no policy
// picks it) but shows as one that takes prefill legs while it is healthy
// and serving; excluding it for a request (a failed leg) clears that too,
// until the next snapshot.
func TestPrefillWorkerIsNoCandidate(t *testing.T) {
	cfg := Config{Replicas: []Replica{{ID: a, Role: route.RolePrefill}, {ID: b, Role: route.RoleDecode}, {ID: c}}}
	if _, err := New(cfg); err == nil {
		t.Error("a prefill worker in a fleet that does not transfer KV: no error")
	}
	cfg.Rates.TransferPerMTokens = 2600 * time.Microsecond
	f := newFleet(t, cfg)
	var s route.Snapshot
	f.Snapshot(&s, t0, 16)
	want := []struct {
		healthy, prefills bool
		role              route.Role
	}{{false, true, route.RolePrefill}, {true, false, route.RoleDecode}, {true, false, route.RoleBoth}}
	for i, w := range want {
		if rp := s.Replicas[i]; rp.Healthy != w.healthy || rp.Prefills != w.prefills || rp.Role != w.role {
			t.Errorf("replica %d: healthy %v prefills %v role %v, want %v %v %v", i, rp.Healthy, rp.Prefills, rp.Role, w.healthy, w.prefills, w.role)
		}
	}
	if err := f.Drain(a); err != nil {
		t.Fatal(err)
	}
	f.Snapshot(&s, t0, 16)
	if s.Replicas[0].Prefills {
		t.Error("a draining prefill worker still takes prefill legs")
	}
	var sc Scratch
	f.Undrain(a)
	d, tk := f.Decide(&Request{ID: "r", Tokens: 100}, []int{0}, t0, &sc)
	if sc.Snapshot.Replicas[0].Prefills || d.Replica == 0 {
		t.Errorf("an excluded prefill worker: prefills %v, picked %d", sc.Snapshot.Replicas[0].Prefills, d.Replica)
	}
	if tk != nil {
		tk.Done(t0, Usage{}, nil)
	}
	f.Decide(&Request{ID: "r2", Tokens: 100}, nil, t0, &sc)
	if !sc.Snapshot.Replicas[0].Prefills {
		t.Error("the next decision still excludes the prefill worker")
	}
}

// legProbe sends every request to replica 1 with a prefill leg on
// replica 0 (a disaggregated decision).
type legProbe struct{}

func (legProbe) Pick(r *route.Request, s *route.Snapshot) route.Decision {
	return route.Decision{Replica: 1, Reason: route.ReasonDisagg, Matched: r.Tokens - 1,
		Transfer: route.Transfer{From: 0, Blocks: (r.Tokens - 1) / 16, Time: time.Millisecond}}
}

func (legProbe) Needs() route.Needs { return route.Needs{Index: route.Approximate} }

// A disaggregated decision makes the worker's Share count the leg and
// its index learn the prompt (the next request with it matches there);
// the leg's load is its runner's to charge, LegClaim's prompt less what
// the worker matched, released when the leg's ticket is done.
func TestPrefillLegCharge(t *testing.T) {
	cfg := Config{Replicas: []Replica{{ID: a, Role: route.RolePrefill}, {ID: b, Role: route.RoleDecode}}, Policy: legProbe{}, BlockSize: 16}
	cfg.Rates.TransferPerMTokens = 2600 * time.Microsecond
	f := newFleet(t, cfg)
	var sc Scratch
	chains := []residency.Chain{{Tokens: 16, Hashes: []prefix.Hash{1, 2, 3, 4}}}
	_, first := f.Decide(&Request{ID: "r1", Tokens: 64, MaxTokens: 8, Chains: chains}, nil, t0, &sc)
	if got := countsOf(f, 0); got != (counts{}) {
		t.Errorf("the decision charged the worker %+v", got)
	}
	var s route.Snapshot
	f.Snapshot(&s, t0, 16)
	if s.Replicas[0].Share <= 0 {
		t.Error("the worker's Share does not count the leg it runs")
	}
	_, second := f.Decide(&Request{ID: "r2", Tokens: 64, MaxTokens: 8, Chains: chains}, nil, t0, &sc)
	if sc.Request.Match[0] != 4 {
		t.Errorf("the worker's index matches %d blocks of a prompt it computed, want 4", sc.Request.Match[0])
	}
	leg, err := f.Acquire(a, LegClaim(64, sc.Request.Match[0]*16), t0)
	if err != nil {
		t.Fatal(err)
	}
	if got := countsOf(f, 0); got.InFlight != 1 || got.PrefillTokens != 0 {
		t.Errorf("a leg on the prompt the worker caches: %+v, want in flight, nothing to compute", got)
	}
	if c := LegClaim(64, 100); c.PrefillTokens != 0 || c.Tokens != 65 || c.PredictedCached != 64 {
		t.Errorf("LegClaim(64, 100) = %+v", c)
	}
	leg.Done(t0, NoUsage, nil)
	first.Done(t0, NoUsage, nil)
	second.FirstToken(t0)
	second.Done(t0, NoUsage, nil)
	for i := range 2 {
		if c := countsOf(f, i); c != (counts{}) {
			t.Errorf("replica %d after all finished: %+v", i, c)
		}
	}
}

package fleet

import (
	"testing"

	"github.com/kvrouter/kvrouter/route"
)

// A prefill worker is never a candidate (Healthy false, so no policy
// picks it) but shows as one that takes prefill legs while it is healthy
// and serving; excluding it for a request (a failed leg) clears that too,
// until the next snapshot.
func TestPrefillWorkerIsNoCandidate(t *testing.T) {
	f := newFleet(t, Config{Replicas: []Replica{{ID: a, Role: route.RolePrefill}, {ID: b, Role: route.RoleDecode}, {ID: c}}})
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

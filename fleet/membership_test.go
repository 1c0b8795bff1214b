package fleet

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
)

// indexed is a policy that picks replica i and reads the approximate
// index.
type indexed struct{ i int }

func (p indexed) Pick(*route.Request, *route.Snapshot) route.Decision {
	return route.Decision{Replica: p.i, Reason: "test"}
}
func (indexed) Needs() route.Needs { return route.Needs{Index: route.Approximate} }

// states returns id → state of f's members.
func states(f *Fleet) map[string]string {
	out := map[string]string{}
	for _, m := range f.Members() {
		out[m.ID] = m.State
	}
	return out
}

func TestDrainStopsNewRequests(t *testing.T) {
	f := newFleet(t, Config{Policy: route.LeastLoaded{}})
	var sc Scratch
	// A session on b, and a request in flight there.
	d, held := f.Decide(&Request{ID: "x", Session: "conv"}, []int{0, 2}, t0, &sc)
	if d.Replica != 1 {
		t.Fatalf("setup: went to %d, want 1", d.Replica)
	}
	if err := f.Drain(b); err != nil {
		t.Fatal(err)
	}
	if !f.Draining(b) {
		t.Error("Draining(b) = false after Drain")
	}
	for i := range 30 {
		d, tk := f.Decide(&Request{ID: fmt.Sprint(i), Hash: uint64(i), Session: "conv"}, nil, t0, &sc)
		if d.Replica == 1 {
			t.Fatalf("request %d went to the draining replica", i)
		}
		tk.Done(t0, NoUsage, nil)
	}
	if got := f.InFlight(b); got != 1 {
		t.Errorf("in flight on b = %d, want 1 (the request sent before the drain)", got)
	}
	held.Done(t0, NoUsage, nil)
	if err := f.Undrain(b); err != nil {
		t.Fatal(err)
	}
	if d, tk := f.Decide(&Request{ID: "y"}, []int{0, 2}, t0, &sc); d.Replica != 1 {
		t.Errorf("after Undrain: went to %d, want 1", d.Replica)
	} else {
		tk.Done(t0, NoUsage, nil)
	}
	if err := f.Drain("http://nowhere"); !errors.Is(err, ErrUnknownReplica) {
		t.Errorf("Drain of an unknown id: %v, want ErrUnknownReplica", err)
	}
}

func TestRemoveKeepsIndicesOfRequestsInFlight(t *testing.T) {
	f := newFleet(t, Config{Policy: indexed{1}, MaxReplicas: 3})
	var sc Scratch
	chains := []residency.Chain{{Tokens: 16, Hashes: []prefix.Hash{7, 8, 9}}}
	_, tk := f.Decide(&Request{ID: "r", Tokens: 48, Session: "conv", Chains: chains}, nil, t0, &sc)
	if held, _ := f.Tracker().Blocks(1); held == 0 {
		t.Fatal("setup: no blocks tracked on b")
	}
	n, err := f.RemoveReplica(b)
	if err != nil || n != 1 {
		t.Fatalf("RemoveReplica(b) = %d, %v; want 1 in flight", n, err)
	}
	if held, _ := f.Tracker().Blocks(1); held != 0 {
		t.Errorf("b's slot still holds %d blocks after its removal", held)
	}
	if got := f.Sessions(); got != 0 {
		t.Errorf("%d sessions after removing their replica, want 0", got)
	}
	if diff := cmp.Diff(map[string]string{a: StateServing, b: StateRemoved, c: StateServing}, states(f)); diff != "" {
		t.Errorf("members (-want +got):\n%s", diff)
	}
	if f.Serves("m") != true || f.At(b) != -1 {
		t.Errorf("At(b) = %d after removal, want -1", f.At(b))
	}
	// The slot is held by the request in flight: a fourth replica finds
	// the fleet full.
	if err := f.AddReplica(Replica{ID: "http://d"}); !errors.Is(err, ErrFull) {
		t.Errorf("AddReplica with b's request in flight: %v, want ErrFull", err)
	}
	var s route.Snapshot
	f.Snapshot(&s, t0, 16)
	if s.Replicas[1].Healthy {
		t.Error("a removed replica is a candidate in the snapshot")
	}
	tk.Done(t0, NoUsage, nil)
	if _, ok := states(f)[b]; ok {
		t.Error("b still listed once its request finished")
	}
	if err := f.AddReplica(Replica{ID: "http://d", Models: []string{"m"}}); err != nil {
		t.Fatal(err)
	}
	if got := f.At("http://d"); got != 1 {
		t.Errorf("new replica at %d, want b's free slot 1", got)
	}
	f.Snapshot(&s, t0, 16)
	if !s.Replicas[1].Healthy || s.Replicas[1].ID != "http://d" || s.Replicas[1].InFlight != 0 {
		t.Errorf("slot 1 = %+v, want d, healthy, nothing in flight", s.Replicas[1])
	}
	// b can come back, as a new replica (the fleet has no room: remove c).
	if _, err := f.RemoveReplica(c); err != nil {
		t.Fatal(err)
	}
	if err := f.AddReplica(Replica{ID: b}); err != nil || f.At(b) != 2 {
		t.Errorf("re-adding b: %v at %d, want slot 2", err, f.At(b))
	}
}

// TestMembershipConcurrent adds, drains and removes replicas while requests
// are decided and finished; run with -race. Every count ends at zero and
// no request ever lands on a replica that was not serving when it was
// decided.
func TestMembershipConcurrent(t *testing.T) {
	f := newFleet(t, Config{Policy: route.LeastLoaded{}, MaxReplicas: 8})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 4 {
		wg.Go(func() {
			var sc Scratch
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				d, tk := f.Decide(&Request{ID: fmt.Sprint(g, "-", i), Hash: uint64(i), Session: fmt.Sprint("s", i%7)}, nil, t0, &sc)
				if tk != nil && !sc.Snapshot.Replicas[d.Replica].Healthy {
					t.Errorf("picked an unavailable replica %d", d.Replica)
				}
				tk.Done(t0, NoUsage, nil)
			}
		})
	}
	for i := range 200 {
		id := fmt.Sprintf("http://dyn%d", i%5)
		switch i % 3 {
		case 0:
			f.AddReplica(Replica{ID: id}) // may be full or present: both fine
		case 1:
			f.Drain(id)
		case 2:
			f.RemoveReplica(id)
		}
		time.Sleep(50 * time.Microsecond) // the churn's pace, so that the deciders run between changes
	}
	close(stop)
	wg.Wait()
	for _, m := range f.Members() {
		if m.InFlight != 0 {
			t.Errorf("%s: %d in flight after every request finished", m.ID, m.InFlight)
		}
	}
}

// TestActivity: a replica's Activity channel closes at the next request
// charged to it and at the next released from it, not at another
// replica's; an unknown replica has none.
func TestActivity(t *testing.T) {
	f := newFleet(t, Config{})
	open := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return false
		default:
			return true
		}
	}
	moved := f.Activity(a)
	other, _ := f.Acquire(b, Claim{PrefillTokens: 10}, t0)
	if !open(moved) {
		t.Fatal("a request to b closed a's channel")
	}
	tk, _ := f.Acquire(a, Claim{PrefillTokens: 10}, t0)
	if open(moved) {
		t.Fatal("a request to a left its channel open")
	}
	moved = f.Activity(a)
	other.Done(t0, Usage{}, nil)
	if !open(moved) {
		t.Fatal("b's release closed a's channel")
	}
	tk.Done(t0, Usage{}, nil)
	if open(moved) {
		t.Fatal("a's release left its channel open")
	}
	if f.Activity("http://unknown:1") != nil {
		t.Error("an unknown replica has a channel")
	}
}

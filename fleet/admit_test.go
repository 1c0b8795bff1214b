package fleet

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/route"
)

// TestAdmissionSaturates: with every replica's queued prefill past
// MaxWait, Decide answers ReasonSaturated without charging anything;
// a ticket's first token calls OnRelease, after which the replica that
// freed takes the request.
func TestAdmissionSaturates(t *testing.T) {
	released := 0
	// 10,000 queued tokens are 460 ms of prefill at the preset's 46 µs a
	// token: past a 200 ms limit.
	f := newFleet(t, Config{Policy: route.LeastLoaded{}, Replicas: reps(a, b),
		Admission: Admission{MaxWait: 200 * time.Millisecond}, OnRelease: func() { released++ }})
	var sc Scratch
	var tickets []*Ticket
	for i := range 2 {
		d, tk := f.Decide(&Request{ID: fmt.Sprint(i), Tokens: 10000}, nil, t0, &sc)
		if tk == nil {
			t.Fatalf("request %d: %+v, want it routed to an idle replica", i, d)
		}
		tickets = append(tickets, tk)
	}
	d, tk := f.Decide(&Request{ID: "late", Tokens: 100, Session: "s"}, nil, t0, &sc)
	if tk != nil || d.Replica != -1 || d.Reason != route.ReasonSaturated {
		t.Fatalf("both replicas 460 ms behind: %+v, ticket %v; want %q and no ticket", d, tk, route.ReasonSaturated)
	}
	if c0, c1 := countsOf(f, 0), countsOf(f, 1); c0.InFlight+c1.InFlight != 2 || f.Sessions() != 0 {
		t.Errorf("a saturated answer charged something: %+v %+v, %d sessions", c0, c1, f.Sessions())
	}
	tickets[1].FirstToken(t0.Add(time.Second))
	if released != 1 {
		t.Errorf("OnRelease called %d times after a first token, want 1", released)
	}
	d, tk = f.Decide(&Request{ID: "late", Tokens: 100}, nil, t0.Add(time.Second), &sc)
	if tk == nil || d.Replica != 1 {
		t.Errorf("after replica 1's prefill: %+v, want it routed to 1", d)
	}
	tk.Done(t0, NoUsage, nil)
	if released != 2 {
		t.Errorf("OnRelease called %d times after Done, want 2", released)
	}
	off := newFleet(t, Config{Policy: route.LeastLoaded{}, Replicas: reps(a)})
	for i := range 3 {
		if _, tk := off.Decide(&Request{ID: fmt.Sprint(i), Tokens: 1e6}, nil, t0, &sc); tk == nil {
			t.Fatalf("admission off: request %d not routed", i)
		}
	}
}

// TestQueueOrder: the queue serves the highest priority first, then the
// first queued; an entry pushed back keeps its place; a full queue leaves
// out its last entry for one that outranks it, else the newcomer.
func TestQueueOrder(t *testing.T) {
	q := NewQueue[string](3)
	e := func(v string, p int) *Entry[string] { return &Entry[string]{Value: v, Priority: p} }
	a0, b0, c5 := e("a0", 0), e("b0", 0), e("c5", 5)
	for _, x := range []*Entry[string]{a0, b0, c5} {
		if out := q.Push(x); out != nil {
			t.Fatalf("push %s: left out %s with room", x.Value, out.Value)
		}
	}
	if out := q.Push(e("d0", 0)); out == nil || out.Value != "d0" {
		t.Errorf("full, equal rank: left out %v, want the newcomer d0", out)
	}
	if out := q.Push(e("e1", 1)); out == nil || out.Value != "b0" {
		t.Errorf("full, higher rank: left out %v, want the last entry b0", out)
	}
	got := q.Pop()
	if got.Value != "c5" {
		t.Fatalf("first pop %s, want c5", got.Value)
	}
	q.Push(got) // tried and pushed back: first again
	var order []string
	if !q.Remove(a0) || q.Remove(a0) {
		t.Error("Remove of a queued entry: want true once, then false")
	}
	for x := q.Pop(); x != nil; x = q.Pop() {
		order = append(order, x.Value)
	}
	if fmt.Sprint(order) != "[c5 e1]" {
		t.Errorf("order %v, want [c5 e1]", order)
	}
}

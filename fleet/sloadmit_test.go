package fleet

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
)

// missPolicy picks replica 0 with the predicted miss miss, reading the
// approximate index, and records the match and the pinned replica it
// saw for replica 0.
type missPolicy struct {
	miss    float64
	matched int
	pinned  int
}

func (p *missPolicy) Pick(r *route.Request, s *route.Snapshot) route.Decision {
	p.matched, p.pinned = r.Match[0], r.Pinned
	return route.Decision{Replica: 0, Reason: "test", Miss: p.miss}
}

func (*missPolicy) Needs() route.Needs { return route.Needs{Index: route.Approximate} }

// TestSLOAdmission: with Admission.SLO queue or reject, a decision whose
// Miss reaches MissThreshold for a request with an SLO commits nothing
// (no load, no session binding, no residency touch, no turn counted) and
// answers ReasonUnattainable with the policy's Miss; below the
// threshold, without an SLO, or Admitted, it commits. With route it
// commits and the decision is Unattainable.
func TestSLOAdmission(t *testing.T) {
	chains := []residency.Chain{{Tokens: 16, Hashes: []prefix.Hash{1, 2, 3, 4}}}
	slo := route.SLO{TTFT: time.Second}
	for _, mode := range []string{SLOQueue, SLOReject} {
		p := &missPolicy{miss: MissThreshold}
		f := newFleet(t, Config{Policy: p, Replicas: reps(a, b),
			Admission: Admission{MaxWait: time.Minute, SLO: mode}})
		var sc Scratch
		req := func(id string) *Request {
			return &Request{ID: id, Tokens: 64, Session: "s", Chains: chains, SLO: slo}
		}
		tally := f.turns
		d, tk := f.Decide(req("1"), nil, t0, &sc)
		if f.turns != tally {
			t.Errorf("%s: refused decision counted in the turn tally: %+v, was %+v", mode, f.turns, tally)
		}
		if tk != nil || d.Replica != -1 || d.Reason != route.ReasonUnattainable || d.Miss != MissThreshold {
			t.Fatalf("%s: %+v, ticket %v; want no ticket, replica -1, %q, miss %v", mode, d, tk, route.ReasonUnattainable, MissThreshold)
		}
		if c := countsOf(f, 0); c.InFlight != 0 || c.PrefillTokens != 0 || f.Sessions() != 0 {
			t.Errorf("%s: refused decision left %+v, %d sessions; want nothing", mode, c, f.Sessions())
		}
		p.miss = MissThreshold - 0.01
		if _, tk = f.Decide(req("2"), nil, t0, &sc); tk == nil {
			t.Fatalf("%s: miss below the threshold not routed", mode)
		}
		if p.matched != 0 || p.pinned != -1 {
			t.Errorf("%s: after the refusal the policy saw %d blocks matched, pinned %d; want 0, -1", mode, p.matched, p.pinned)
		}
		if c := countsOf(f, 0); c.InFlight != 1 || f.Sessions() != 1 {
			t.Errorf("%s: routed request: %+v, %d sessions; want 1 in flight, 1 session", mode, c, f.Sessions())
		}
		p.miss = 0.9
		if d, tk = f.Decide(req("3"), nil, t0, &sc); tk != nil {
			t.Fatalf("%s: second refusal routed: %+v", mode, d)
		}
		if p.matched != 4 || p.pinned != 0 {
			t.Errorf("%s: after a committed decision the policy saw %d blocks, pinned %d; want 4, 0", mode, p.matched, p.pinned)
		}
		if c := countsOf(f, 0); c.InFlight != 1 {
			t.Errorf("%s: refused decision charged: %d in flight, want 1", mode, c.InFlight)
		}
		again := req("4")
		again.Admitted = true
		if _, tk = f.Decide(again, nil, t0, &sc); tk == nil {
			t.Errorf("%s: an admitted request refused", mode)
		}
		none := req("5")
		none.SLO = route.SLO{}
		if _, tk = f.Decide(none, nil, t0, &sc); tk == nil {
			t.Errorf("%s: a request without an SLO refused", mode)
		}
	}
	p := &missPolicy{miss: 0.9}
	f := newFleet(t, Config{Policy: p, Replicas: reps(a, b), Admission: Admission{SLO: SLORoute}})
	var sc Scratch
	r := &Request{ID: "1", Tokens: 64, Session: "s", Chains: chains, SLO: slo}
	d, tk := f.Decide(r, nil, t0, &sc)
	if tk == nil || d.Replica != 0 || d.Reason != "test" || !Unattainable(r, &d) {
		t.Fatalf("route: %+v, ticket %v; want replica 0 committed, its reason kept, Unattainable", d, tk)
	}
	if c := countsOf(f, 0); c.InFlight != 1 || f.Sessions() != 1 {
		t.Errorf("route: %+v, %d sessions; want 1 in flight, 1 session", c, f.Sessions())
	}
}

// TestSLOAdmissionSettings: Validate takes the three modes and refuses
// another, and queue without the queue; Remaining and Patience count
// down the TTFT bound.
func TestSLOAdmissionSettings(t *testing.T) {
	for mode, ok := range map[string]bool{"": true, SLORoute: true, SLOReject: true, SLOQueue: true, "drop": false} {
		if err := (Admission{MaxWait: time.Second, SLO: mode}).Validate(); (err == nil) != ok {
			t.Errorf("mode %q: %v, want ok %v", mode, err, ok)
		}
	}
	if err := (Admission{SLO: SLOQueue}).Validate(); err == nil {
		t.Error("queue without max-wait accepted")
	}
	slo := route.SLO{TTFT: time.Second, ITL: 50 * time.Millisecond}
	if got := Remaining(slo, 300*time.Millisecond); got.TTFT != 700*time.Millisecond || got.ITL != slo.ITL {
		t.Errorf("Remaining after 300ms: %+v", got)
	}
	if got := Remaining(slo, 2*time.Second); got.TTFT != 1 {
		t.Errorf("Remaining past the bound: %v, want 1ns", got.TTFT)
	}
	a := Admission{QueueTimeout: 5 * time.Second}
	if got := a.Patience(slo, true, 300*time.Millisecond); got != 700*time.Millisecond {
		t.Errorf("Patience queued for the SLO: %v, want 700ms", got)
	}
	if got := a.Patience(slo, false, 300*time.Millisecond); got != 5*time.Second {
		t.Errorf("Patience queued for saturation: %v, want 5s", got)
	}
}

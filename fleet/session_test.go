package fleet

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
)

func TestSessionsLRU(t *testing.T) {
	f := newFleet(t, Config{Sessions: Sessions{SessionTTL: time.Hour, MaxSessions: 3}})
	ra, rb := f.lookup(a), f.lookup(b)
	var s route.Snapshot
	f.Snapshot(&s, t0, 0)
	for i, id := range []string{"s1", "s2", "s3"} {
		f.bind(id, ra, t0.Add(time.Duration(i)*time.Second), nil)
	}
	f.bind("s1", rb, t0.Add(3*time.Second), nil) // s1 is now the most recent, s2 the least
	f.bind("s4", ra, t0.Add(4*time.Second), nil) // evicts s2
	if n := f.Sessions(); n != 3 {
		t.Fatalf("got %d sessions, want 3", n)
	}
	if got := f.SessionsEvicted(); got != 1 {
		t.Errorf("got %d evicted, want 1", got)
	}
	for id, want := range map[string]int{"s1": 1, "s2": -1, "s3": 0, "s4": 0} {
		if got, _ := f.pin(id, nil, &s, t0.Add(5*time.Second)); got != want {
			t.Errorf("pin(%s) = %d, want %d", id, got, want)
		}
	}
}

func TestSessionsSweepFromBack(t *testing.T) {
	f := newFleet(t, Config{Sessions: Sessions{SessionTTL: time.Minute}})
	ra := f.lookup(a)
	for i := range 100 {
		f.bind(fmt.Sprint("s", i), ra, t0.Add(time.Duration(i)*time.Second), nil)
	}
	// The last sweep ran at 93 s; at 130 s, those bound before 70 s have
	// expired: s70..s99 remain, and late.
	f.bind("late", ra, t0.Add(130*time.Second), nil)
	if n := f.Sessions(); n != 31 {
		t.Errorf("after sweep: %d sessions, want 31", n)
	}
}

func TestSessionKey(t *testing.T) {
	short := strings.Repeat("x", MaxSessionIDBytes)
	if got := SessionKey(short); got != short {
		t.Errorf("SessionKey of %d bytes = %q, want it unchanged", len(short), got)
	}
	long1, long2 := strings.Repeat("y", 900<<10), strings.Repeat("y", 900<<10-1)+"z"
	k1, k2 := SessionKey(long1), SessionKey(long2)
	if len(k1) > MaxSessionIDBytes || len(k2) > MaxSessionIDBytes || k1 == k2 || k1 != SessionKey(long1) {
		t.Errorf("keys %q, %q: want distinct, stable, at most %d bytes", k1, k2, MaxSessionIDBytes)
	}

	// A long id binds under its key: the table holds the key, not the id.
	f := newFleet(t, Config{})
	var s route.Snapshot
	f.Snapshot(&s, t0, 0)
	f.bind(long1, f.lookup(b), t0, nil)
	if got, _ := f.pin(long1, nil, &s, t0); got != 1 {
		t.Errorf("pin of a long id = %d, want 1", got)
	}
	for k := range f.sessions.byKey {
		if len(k) > MaxSessionIDBytes {
			t.Errorf("stored a key of %d bytes", len(k))
		}
	}
}

// TestFutureTurns: conversations of four requests, each extending the
// last, make every request expect three more to follow it; sessions of
// four requests that share only a prefix (a group's context, then a new
// question each), none; single requests, none.
func TestFutureTurns(t *testing.T) {
	for _, tc := range []struct {
		name   string
		turns  int
		extend bool
		want   float64
	}{{"conversation", 4, true, 3}, {"shared context", 4, false, 0}, {"single", 1, true, 0}} {
		var tally turnTally
		var got float64
		for range 2000 / tc.turns {
			for k := range tc.turns {
				got = tally.next(k > 0 && tc.extend)
			}
		}
		if math.Abs(got-tc.want) > 0.05 {
			t.Errorf("%s: %.3f later turns expected, want %.0f", tc.name, got, tc.want)
		}
	}
}

// TestDecideExpectsTurns: through Decide, the requests of conversations
// whose every turn extends the last come to expect the turns that follow
// them (three, for four-turn conversations), while those of sessions
// that share only a context expect none; every decision's replica gains
// share.
func TestDecideExpectsTurns(t *testing.T) {
	for _, tc := range []struct {
		name   string
		extend bool
		want   float64
	}{{"conversation", true, 3}, {"shared context", false, 0}} {
		var turns float64
		p := route.Func(func(r *route.Request, s *route.Snapshot) route.Decision {
			turns = r.FutureTurns
			return route.Decision{Replica: int(r.Seq % 2)}
		})
		f := newFleet(t, Config{Policy: p})
		var sc Scratch
		for k := range 4000 {
			session, turn := k/4, k%4
			hashes := []prefix.Hash{1, prefix.Hash(100 + session)} // a context, then the session's own
			for j := range turn {
				if tc.extend {
					hashes = append(hashes, prefix.Hash(1000*session+j))
				}
			}
			if !tc.extend {
				hashes = append(hashes, prefix.Hash(1000*session+turn)) // a new question
			}
			req := &Request{ID: fmt.Sprint(k), Tokens: 16 * len(hashes), Session: fmt.Sprint("s", session),
				Chains: []residency.Chain{{Tokens: 16, Hashes: hashes}}}
			_, tk := f.Decide(req, nil, t0, &sc)
			tk.Done(t0, NoUsage, nil)
		}
		if math.Abs(turns-tc.want) > 0.1 {
			t.Errorf("%s: the last request expects %.2f turns to follow it, want %.0f", tc.name, turns, tc.want)
		}
		var s route.Snapshot
		f.Snapshot(&s, t0, 0)
		if a, b := s.Replicas[0].ShareAt(4000, 3), s.Replicas[1].ShareAt(4000, 3); math.Abs(a-0.5) > 0.1 || math.Abs(b-0.5) > 0.1 {
			t.Errorf("%s: shares %.2f and %.2f of requests sent alternately to two replicas, want 0.5 each", tc.name, a, b)
		}
	}
}

package fleet

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/route"
)

func TestSessionsLRU(t *testing.T) {
	f := newFleet(t, Config{SessionTTL: time.Hour, MaxSessions: 3})
	ra, rb := f.lookup(a), f.lookup(b)
	var s route.Snapshot
	f.Snapshot(&s, t0, 0)
	for i, id := range []string{"s1", "s2", "s3"} {
		f.bind(id, ra, t0.Add(time.Duration(i)*time.Second))
	}
	f.bind("s1", rb, t0.Add(3*time.Second)) // s1 is now the most recent, s2 the least
	f.bind("s4", ra, t0.Add(4*time.Second)) // evicts s2
	if n := f.Sessions(); n != 3 {
		t.Fatalf("got %d sessions, want 3", n)
	}
	if got := f.SessionsEvicted(); got != 1 {
		t.Errorf("got %d evicted, want 1", got)
	}
	for id, want := range map[string]int{"s1": 1, "s2": -1, "s3": 0, "s4": 0} {
		if got := f.pin(id, &s, t0.Add(5*time.Second)); got != want {
			t.Errorf("pin(%s) = %d, want %d", id, got, want)
		}
	}
}

func TestSessionsSweepFromBack(t *testing.T) {
	f := newFleet(t, Config{SessionTTL: time.Minute})
	ra := f.lookup(a)
	for i := range 100 {
		f.bind(fmt.Sprint("s", i), ra, t0.Add(time.Duration(i)*time.Second))
	}
	// The last sweep ran at 93 s; at 130 s, those bound before 70 s have
	// expired: s70..s99 remain, and late.
	f.bind("late", ra, t0.Add(130*time.Second))
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
	f.bind(long1, f.lookup(b), t0)
	if got := f.pin(long1, &s, t0); got != 1 {
		t.Errorf("pin of a long id = %d, want 1", got)
	}
	for k := range f.sessions.byKey {
		if len(k) > MaxSessionIDBytes {
			t.Errorf("stored a key of %d bytes", len(k))
		}
	}
}

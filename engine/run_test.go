package engine

import (
	"slices"
	"testing"
	"time"
)

// arrival is a request added at a time, for the test driver.
type arrival struct {
	at  time.Duration
	req Request
}

// drive runs e over the arrivals (sorted by time) until it is idle, the
// way the simulator does, and returns a copy of every event.
func drive(t testing.TB, e *Engine, arrivals []arrival) []Event {
	t.Helper()
	var all []Event
	now, next := time.Duration(0), Idle
	for i := 0; i < len(arrivals) || next != Idle; {
		if i < len(arrivals) && arrivals[i].at <= next {
			// Simultaneous arrivals are all queued before the next Step.
			now = arrivals[i].at
			for ; i < len(arrivals) && arrivals[i].at == now; i++ {
				r := arrivals[i].req
				if err := e.Add(now, &r); err != nil {
					t.Fatalf("add %s: %v", r.ID, err)
				}
			}
		} else {
			now = next
		}
		var evs []Event
		evs, next = e.Step(now)
		for _, ev := range evs {
			// Hashes of BlockRemoved alias an engine buffer.
			ev.Hashes = slices.Clone(ev.Hashes)
			all = append(all, ev)
		}
		if len(all) > 10_000_000 {
			t.Fatal("runaway")
		}
	}
	return all
}

// byReq returns the Done event of each request.
func doneOf(evs []Event) map[string]Event {
	m := map[string]Event{}
	for _, ev := range evs {
		if ev.Kind == Done {
			m[ev.Req] = ev
		}
	}
	return m
}

// toks returns n token ids starting at from.
func toks(from, n int) []uint32 {
	ts := make([]uint32, n)
	for i := range ts {
		ts[i] = uint32(from + i)
	}
	return ts
}

func mustNew(t testing.TB, c Config) *Engine {
	t.Helper()
	e, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

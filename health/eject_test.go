package health

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// lister is a replica whose /health answers 200 and whose /v1/models
// lists the model ids set (a JSON body).
type lister struct{ listing atomic.Pointer[string] }

func (l *lister) set(ids ...string) {
	s := `{"object":"list","data":[`
	for i, id := range ids {
		if i > 0 {
			s += ","
		}
		s += `{"id":"` + id + `","object":"model"}`
	}
	s += "]}"
	l.listing.Store(&s)
}

func (l *lister) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
	case "/v1/models":
		w.Write([]byte(*l.listing.Load()))
	default:
		http.NotFound(w, r)
	}
}

// ejections records OnEject and OnHold calls.
type ejections struct {
	mu    sync.Mutex
	got   []Ejection
	holds []string
}

func (e *ejections) hook(c *Checker) {
	c.OnEject = func(id string, ej Ejection) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.got = append(e.got, ej)
	}
	c.OnHold = func(id, reason string) {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.holds = append(e.holds, reason)
	}
}

func (e *ejections) get() ([]Ejection, []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]Ejection(nil), e.got...), append([]string(nil), e.holds...)
}

// id is the replica the synctest tests probe.
const id = "http://replica:8000"

// runFirstProbe runs c (in a synctest bubble) over id until its first
// probe is done, and returns the function that stops it.
func runFirstProbe(t *testing.T, c *Checker, id string) context.CancelFunc {
	c.Add(id)
	ctx, cancel := context.WithCancel(t.Context())
	go c.Run(ctx)
	time.Sleep(offset(id, DefaultInterval) + time.Nanosecond) // synctest: advances the bubble's clock
	synctest.Wait()
	return cancel
}

// TestImpostorNotReadmitted ejects a replica (a refused connection), lets
// another service that answers /health 200 but lists another model take
// its address, and checks it stays out however long, with one hold reason,
// until the model is listed again.
func TestImpostorNotReadmitted(t *testing.T) {
	for _, declared := range []bool{false, true} {
		name := "learned"
		if declared {
			name = "declared"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var srv lister
				srv.set("m", "m-lora")
				var e ejections
				c := &Checker{Client: &http.Client{Transport: handlerTransport{&srv}}}
				if declared {
					c.Models = func(string) []string { return []string{"m"} }
					srv.set("x") // never listed it: only the declaration says
				}
				e.hook(c)
				cancel := runFirstProbe(t, c, id) // learns m, m-lora
				defer cancel()

				c.Eject(id, "connect: connection refused")
				if c.Healthy(id) {
					t.Fatal("healthy after Eject")
				}
				srv.set("other")
				time.Sleep(10 * time.Second) // synctest: advances the bubble's clock
				synctest.Wait()
				got, holds := e.get()
				if c.Healthy(id) {
					t.Fatal("another service at the address was re-admitted")
				}
				if len(got) != 1 || got[0].Kind != KindConnect || got[0].For != DefaultEjectBase {
					t.Errorf("ejections: got %+v, want one connect ejection for 1s", got)
				}
				if len(holds) != 1 || !strings.Contains(holds[0], `lists no ["m"`) {
					t.Errorf("holds: got %q, want one saying it lists no m", holds)
				}
				srv.set("m", "m-lora", "new")
				time.Sleep(DefaultInterval) // synctest: advances the bubble's clock
				synctest.Wait()
				if !c.Healthy(id) {
					t.Error("the replica listing its model again stays out")
				}
			})
		})
	}
}

// TestEjectionBackoff keeps failing every request of a replica whose
// /health says 200, as an engine answering 500 at once does: its ejection
// times double from 1 s to 30 s instead of it flapping every probe, and
// once it has stayed in service for 30 s its next ejection is 1 s again.
func TestEjectionBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var srv lister
		srv.set("m")
		var e ejections
		c := &Checker{Client: &http.Client{Transport: handlerTransport{&srv}}}
		e.hook(c)
		cancel := runFirstProbe(t, c, id)
		defer cancel()

		admitted := 0
		wasHealthy := true
		// synctest: each sleep advances the bubble's clock
		for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			h := c.Healthy(id)
			if h && !wasHealthy {
				admitted++
			}
			wasHealthy = h
			if h {
				c.ReportFailure(id)
			}
		}
		got, _ := e.get()
		want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second}
		if len(got) != len(want) || admitted != len(want)-1 {
			t.Fatalf("in 60s: %d ejections (%+v), %d returns; want %d, %d", len(got), got, admitted, len(want), len(want)-1)
		}
		for i, ej := range got {
			if ej.For != want[i] || ej.InARow != i+1 || ej.Kind != KindPassive {
				t.Errorf("ejection %d: got %+v, want passive for %v, %d in a row", i, ej, want[i], i+1)
			}
		}

		for !c.Healthy(id) {
			time.Sleep(100 * time.Millisecond) // synctest: advances the bubble's clock
		}
		time.Sleep(DefaultEjectMax) // a healthy period: the count resets
		for range DefaultConsecutive {
			c.ReportFailure(id)
		}
		if got, _ := e.get(); len(got) != len(want)+1 || got[len(want)].For != DefaultEjectBase || got[len(want)].InARow != 1 {
			t.Errorf("after 30s in service: got %+v, want a 1s ejection, the first in a row", got[len(want):])
		}
		cancel()
		synctest.Wait()
	})
}

// TestEjectUnknownAndDown checks that Eject ignores unknown ids and does
// not extend an ejection already running.
func TestEjectUnknownAndDown(t *testing.T) {
	var e ejections
	c := &Checker{}
	e.hook(c)
	c.Eject("http://nobody", "refused") // must not panic
	c.Add("http://a")
	c.Eject("http://a", "refused")
	c.Eject("http://a", "refused")
	if got, _ := e.get(); len(got) != 1 || c.Healthy("http://a") {
		t.Errorf("two Ejects: got %d ejections, healthy %v; want 1, false", len(got), c.Healthy("http://a"))
	}
}

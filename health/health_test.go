package health

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// change is one OnChange call.
type change struct {
	id      string
	healthy bool
}

// waitChange waits for the next transition or fails after 10 s.
func waitChange(t *testing.T, ch <-chan change) change {
	t.Helper()
	select {
	case c := <-ch:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no health transition within 10 s")
		return change{}
	}
}

// TestCheckerServerDiesAndReturns kills a real loopback server, expects the
// replica to turn unhealthy, restarts a server on the same port and expects
// it back.
func TestCheckerServerDiesAndReturns(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			http.NotFound(w, r)
		}
	})
	srv := httptest.NewServer(ok)
	addr := srv.Listener.Addr().String()
	ch := make(chan change, 16)
	c := &Checker{
		Interval: 10 * time.Millisecond,
		Timeout:  200 * time.Millisecond,
		OnChange: func(id string, h bool) { ch <- change{id, h} },
	}
	c.Add(srv.URL)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go c.Run(ctx)

	time.Sleep(50 * time.Millisecond) // staying healthy through five probe periods is the behaviour under test
	if !c.Healthy(srv.URL) {
		t.Fatal("live server reported unhealthy")
	}
	srv.Close()
	if got := waitChange(t, ch); got != (change{srv.URL, false}) {
		t.Fatalf("after close: %+v, want unhealthy", got)
	}
	if c.Healthy(srv.URL) {
		t.Error("Healthy true after the server died")
	}

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("relisten on %s: %v", addr, err)
	}
	srv2 := &httptest.Server{Listener: ln, Config: &http.Server{Handler: ok}}
	srv2.Start()
	defer srv2.Close()
	if got := waitChange(t, ch); got != (change{srv.URL, true}) {
		t.Fatalf("after restart: %+v, want healthy", got)
	}
	if !c.Healthy(srv.URL) {
		t.Error("Healthy false after the server came back")
	}
}

// TestCheckerFlippingHandler uses a handler that answers 503, then 200, on
// a fake clock, and checks the exact probe counts for each transition.
func TestCheckerFlippingHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var down atomic.Bool
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if down.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
		})
		var mu sync.Mutex
		var changes []change
		got := func() []change {
			mu.Lock()
			defer mu.Unlock()
			return append([]change(nil), changes...)
		}
		c := &Checker{
			Client:   &http.Client{Transport: handlerTransport{h}},
			Failures: 3,
			OnChange: func(id string, h bool) {
				mu.Lock()
				defer mu.Unlock()
				changes = append(changes, change{id, h})
			},
		}
		const id = "http://replica:8000"
		c.Add(id)
		ctx, cancel := context.WithCancel(t.Context())
		go c.Run(ctx)

		time.Sleep(offset(id, DefaultInterval) + time.Nanosecond) // first probe
		synctest.Wait()
		down.Store(true)
		time.Sleep(2 * time.Second) // two failed probes: not yet
		synctest.Wait()
		if !c.Healthy(id) || len(got()) != 0 {
			t.Fatalf("after 2 failed probes: healthy %v, changes %v; want healthy, none", c.Healthy(id), got())
		}
		time.Sleep(time.Second) // third
		synctest.Wait()
		if c.Healthy(id) {
			t.Fatal("healthy after 3 failed probes, want unhealthy")
		}
		down.Store(false)
		time.Sleep(time.Second) // synctest: advances the bubble's clock
		synctest.Wait()
		if !c.Healthy(id) {
			t.Fatal("unhealthy after a good probe, want healthy")
		}
		want := []change{{id, false}, {id, true}}
		if ch := got(); len(ch) != 2 || ch[0] != want[0] || ch[1] != want[1] {
			t.Errorf("changes = %v, want %v", ch, want)
		}
		cancel()
		synctest.Wait()
	})
}

// handlerTransport serves requests in-process, so that a synctest bubble's
// goroutines block only on timers.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if err := r.Context().Err(); err != nil {
		return nil, err
	}
	w := httptest.NewRecorder()
	t.h.ServeHTTP(w, r)
	return w.Result(), nil
}

// TestPassive checks the passive rule on a fake clock, without probes.
func TestPassive(t *testing.T) {
	type step struct {
		wait      time.Duration // sleep before this step
		fails     int
		successes int
		want      bool // Healthy after the step
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"four failures stay healthy", []step{{fails: 4, want: true}}},
		{"five failures eject", []step{{fails: 5, want: false}}},
		{"failures spread beyond the window", []step{
			{fails: 3, want: true},
			{wait: 11 * time.Second, successes: 1, fails: 3, want: true},
		}},
		{"failures inside the window add up", []step{
			{fails: 3, want: true},
			{wait: 5 * time.Second, fails: 2, want: false},
		}},
		{"successes dilute failures", []step{
			{successes: 20, want: true},
			{fails: 4, want: true},
			{successes: 1, fails: 4, want: true},
		}},
		{"five in a row eject despite successes", []step{
			{successes: 20, want: true},
			{fails: 4, want: true},
			{fails: 1, want: false},
		}},
		{"mostly failures eject despite successes", []step{
			{successes: 5, want: true},
			{fails: 5, want: false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := &Checker{}
				const id = "http://r"
				c.Add(id)
				for i, s := range tt.steps {
					time.Sleep(s.wait) // synctest: advances the bubble's clock
					for range s.successes {
						c.ReportSuccess(id)
					}
					for range s.fails {
						c.ReportFailure(id)
					}
					if got := c.Healthy(id); got != s.want {
						t.Errorf("step %d: Healthy = %v, want %v", i, got, s.want)
					}
				}
			})
		})
	}
}

func TestUnknownAndRemoved(t *testing.T) {
	c := &Checker{}
	if c.Healthy("http://nobody") {
		t.Error("unknown replica reported healthy")
	}
	c.ReportFailure("http://nobody") // must not panic
	c.Add("http://a")
	if !c.Healthy("http://a") {
		t.Error("new replica not healthy")
	}
	c.Remove("http://a")
	if c.Healthy("http://a") {
		t.Error("removed replica reported healthy")
	}
}

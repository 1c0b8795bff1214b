package health

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/poll"
)

// offset is the delay before a replica's first probe.
func offset(id string, interval time.Duration) time.Duration { return poll.Offset(id, interval) }

// routes is a replica whose /health and /v1/models answer set statuses (0
// means the route does not exist: 404), counting the requests to each.
type routes struct {
	health, models atomic.Int32 // status codes
	hits           sync.Map     // path → *atomic.Int64
}

func (rt *routes) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, _ := rt.hits.LoadOrStore(r.URL.Path, new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
	code := 0
	switch r.URL.Path {
	case "/health":
		code = int(rt.health.Load())
	case "/v1/models":
		code = int(rt.models.Load())
		if code == http.StatusOK {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"object":"list","data":[{"id":"m","object":"model"}]}`))
			return
		}
	}
	if code == 0 {
		http.NotFound(w, r)
		return
	}
	w.WriteHeader(code)
}

// count returns how many requests path has had.
func (rt *routes) count(path string) int64 {
	n, ok := rt.hits.Load(path)
	if !ok {
		return 0
	}
	return n.(*atomic.Int64).Load()
}

// log collects a Checker's transitions and fallback notes.
type log struct {
	mu          sync.Mutex
	transitions []string // "up: reason" or "down: reason"
	notes       []string
}

func (l *log) hook(c *Checker) {
	c.OnTransition = func(id string, healthy bool, reason string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		state := "down: "
		if healthy {
			state = "up: "
		}
		l.transitions = append(l.transitions, state+reason)
	}
	c.OnFallback = func(id, note string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.notes = append(l.notes, note)
	}
}

func (l *log) get() (transitions, notes []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.transitions), slices.Clone(l.notes)
}

// TestFallback probes real loopback servers with and without /health and
// /v1/models, and checks which route each ends up probed at, its health,
// and the notes and reasons the operator gets.
func TestFallback(t *testing.T) {
	const none = 0
	tests := []struct {
		name           string
		path           string // Checker.Path
		health, models int    // status codes; none: no such route
		wantProbe      string // route probed at the end; "" for passive only
		wantHealthy    bool
		wantNotes      []string // with {u} for the server's URL
		wantReasons    []string
	}{
		{name: "health ok", health: 200, models: 200, wantProbe: "/health", wantHealthy: true},
		{name: "no health, models ok", health: none, models: 200, wantProbe: "/v1/models", wantHealthy: true,
			wantNotes: []string{"probe {u}/health: status 404 Not Found; probing {u}/v1/models instead"}},
		{name: "health 405, models ok", health: 405, models: 200, wantProbe: "/v1/models", wantHealthy: true,
			wantNotes: []string{"probe {u}/health: status 405 Method Not Allowed; probing {u}/v1/models instead"}},
		{name: "custom path missing", path: "/ping", health: 200, models: 200, wantProbe: "/v1/models", wantHealthy: true,
			wantNotes: []string{"probe {u}/ping: status 404 Not Found; probing {u}/v1/models instead"}},
		{name: "neither", health: none, models: none, wantProbe: "", wantHealthy: true,
			wantNotes: []string{
				"probe {u}/health: status 404 Not Found; probing {u}/v1/models instead",
				"probe {u}/v1/models: status 404 Not Found; no probe route, passive checks only",
			}},
		{name: "no health, models 503", health: none, models: 503, wantProbe: "/v1/models", wantHealthy: false,
			wantNotes:   []string{"probe {u}/health: status 404 Not Found; probing {u}/v1/models instead"},
			wantReasons: []string{"down: probe {u}/v1/models: status 503 Service Unavailable (2 consecutive failures); out for 1s"}},
		{name: "health 503 is not a missing route", health: 503, models: 200, wantProbe: "/health", wantHealthy: false,
			wantReasons: []string{"down: probe {u}/health: status 503 Service Unavailable (2 consecutive failures); out for 1s"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := &routes{}
			rt.health.Store(int32(tt.health))
			rt.models.Store(int32(tt.models))
			srv := httptest.NewServer(rt)
			defer srv.Close()
			var l log
			c := &Checker{Interval: 5 * time.Millisecond, Timeout: time.Second, Path: tt.path}
			l.hook(c)
			c.Add(srv.URL)
			ctx, cancel := context.WithCancel(t.Context())
			ran := make(chan error, 1)
			go func() { ran <- c.Run(ctx) }()

			// Three probes of the final route are recorded once a fourth
			// is sent; a replica without one gets no more probes.
			final := tt.wantProbe
			if final == "" {
				final = "/v1/models"
			}
			wait.For(t, "settled probes", func() bool {
				if tt.wantProbe == "" {
					_, notes := l.get()
					return len(notes) == 2
				}
				return rt.count(final) >= 4
			})
			if tt.wantProbe == "" {
				time.Sleep(10 * c.Interval) // room for probes that must not come
			}
			cancel()
			<-ran
			if tt.wantProbe == "" {
				if n := rt.count("/v1/models"); n != 1 {
					t.Errorf("probes of /v1/models: got %d, want 1 (then none)", n)
				}
			}

			u := func(ss []string) []string {
				var out []string
				for _, s := range ss {
					out = append(out, strings.ReplaceAll(s, "{u}", srv.URL))
				}
				return out
			}
			st, ok := c.Status(srv.URL)
			wantProbe := ""
			if tt.wantProbe != "" {
				wantProbe = srv.URL + tt.wantProbe
			}
			if !ok || st.Probe != wantProbe || st.Healthy != tt.wantHealthy {
				t.Errorf("status: got %+v (ok %v), want Probe %q, Healthy %v", st, ok, wantProbe, tt.wantHealthy)
			}
			transitions, notes := l.get()
			if !slices.Equal(notes, u(tt.wantNotes)) {
				t.Errorf("notes: got %q, want %q", notes, u(tt.wantNotes))
			}
			if !slices.Equal(transitions, u(tt.wantReasons)) {
				t.Errorf("transitions: got %q, want %q", transitions, u(tt.wantReasons))
			}
		})
	}
}

// TestPassiveOnly runs a real server with neither /health nor /v1/models:
// it stays healthy until passive failures eject it, with the reason, and
// is back in service once its ejection time is over although nothing
// probes it.
func TestPassiveOnly(t *testing.T) {
	rt := &routes{} // neither route
	srv := httptest.NewServer(rt)
	defer srv.Close()
	var l log
	const window = 300 * time.Millisecond
	c := &Checker{Interval: 5 * time.Millisecond, Timeout: time.Second, Window: window, Outlier: Outlier{EjectBase: window}}
	l.hook(c)
	var mu sync.Mutex
	var changed []time.Time
	c.OnChange = func(string, bool) {
		mu.Lock()
		defer mu.Unlock()
		changed = append(changed, time.Now())
	}
	c.Add(srv.URL)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go c.Run(ctx)

	wait.For(t, "passive-only note", func() bool { _, notes := l.get(); return len(notes) == 2 })
	time.Sleep(10 * c.Interval) // staying healthy through ten probe periods is the behaviour under test
	if st, _ := c.Status(srv.URL); !st.Healthy || st.Probe != "" {
		t.Fatalf("without probe routes: got %+v, want healthy, no probe", st)
	}
	c.ReportSuccess(srv.URL)
	for range 4 {
		c.ReportFailure(srv.URL)
	}
	if !c.Healthy(srv.URL) {
		t.Fatal("after 4 of 5 failed: got unhealthy, want healthy")
	}
	c.ReportFailure(srv.URL)
	if c.Healthy(srv.URL) {
		t.Fatal("after 5 of 6 failed: got healthy, want unhealthy")
	}
	wait.For(t, "return to service", func() bool { return c.Healthy(srv.URL) })

	transitions, _ := l.get()
	want := []string{
		"down: passive: 5 of 6 requests failed in 300ms; out for 300ms",
		"up: passive: back in service after 300ms out (no probe route)",
	}
	if !slices.Equal(transitions, want) {
		t.Errorf("transitions: got %q, want %q", transitions, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(changed) != 2 || changed[1].Sub(changed[0]) < window {
		t.Errorf("OnChange times %v: want 2, at least %v apart", changed, window)
	}
	if h, m := rt.count("/health"), rt.count("/v1/models"); h != 1 || m != 1 {
		t.Errorf("probes of /health, /v1/models: got %d, %d, want 1, 1 (then none)", h, m)
	}
}

// TestReasons checks the reason of every kind of transition, on a fake
// clock: probe failures, a probe success, passive failures, and a return
// to service without probes, with ejection times doubling (1 s, 2 s, 4 s)
// for ejections in a row.
func TestReasons(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := &routes{}
		rt.health.Store(http.StatusServiceUnavailable)
		rt.models.Store(http.StatusOK)
		var l log
		c := &Checker{Client: &http.Client{Transport: handlerTransport{rt}}}
		l.hook(c)
		const id = "http://replica:8000/"
		c.Add(id)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go c.Run(ctx)

		time.Sleep(offset(id, DefaultInterval) + time.Nanosecond) // first failed probe
		synctest.Wait()
		time.Sleep(DefaultInterval) // second
		synctest.Wait()
		rt.health.Store(http.StatusOK)
		time.Sleep(DefaultInterval) // synctest: advances the bubble's clock
		synctest.Wait()
		for range 5 { // the second ejection in a row: 2 s
			c.ReportFailure(id)
		}
		rt.health.Store(http.StatusNotFound)
		rt.models.Store(http.StatusNotFound)
		time.Sleep(DefaultInterval) // falls back twice, and then rests; still out
		synctest.Wait()
		st, _ := c.Status(id)
		if st.Probe != "" || st.Healthy {
			t.Errorf("1s into a 2s ejection, both routes 404: got %+v, want unhealthy, no probe", st)
		}
		time.Sleep(2 * DefaultInterval) // back: the ejection time is over
		synctest.Wait()
		if !c.Healthy(id) {
			t.Fatal("3s into a 2s ejection: got unhealthy, want healthy")
		}
		for range 5 { // the third: 4 s
			c.ReportFailure(id)
		}
		down := time.Now()
		time.Sleep(4*DefaultEjectBase - DefaultInterval) // synctest: advances the bubble's clock
		synctest.Wait()
		if c.Healthy(id) {
			t.Errorf("%v after the third ejection: got healthy, want unhealthy", time.Since(down))
		}
		time.Sleep(2 * DefaultInterval) // synctest: advances the bubble's clock
		synctest.Wait()
		if st, _ := c.Status(id); !st.Healthy || st.Ejections != 3 || st.Since.Sub(down) < 4*DefaultEjectBase || st.Since.Sub(down) > 4*DefaultEjectBase+DefaultInterval {
			t.Errorf("status %v after the ejection: got %+v, want healthy since %v..%v later, 3 ejections", time.Since(down), st, 4*DefaultEjectBase, 4*DefaultEjectBase+DefaultInterval)
		}

		transitions, notes := l.get()
		want := []string{
			"down: probe http://replica:8000/health: status 503 Service Unavailable (2 consecutive failures); out for 1s",
			"up: probe http://replica:8000/health: status 200 OK",
			"down: passive: 5 of 5 requests failed in 10s; out for 2s",
			"up: passive: back in service after 2s out (no probe route)",
			"down: passive: 5 of 5 requests failed in 10s; out for 4s",
			"up: passive: back in service after 4s out (no probe route)",
		}
		if !slices.Equal(transitions, want) {
			t.Errorf("transitions:\ngot  %q\nwant %q", transitions, want)
		}
		wantNotes := []string{
			"probe http://replica:8000/health: status 404 Not Found; probing http://replica:8000/v1/models instead",
			"probe http://replica:8000/v1/models: status 404 Not Found; no probe route, passive checks only",
		}
		if !slices.Equal(notes, wantNotes) {
			t.Errorf("notes:\ngot  %q\nwant %q", notes, wantNotes)
		}
	})
}

func TestStatusUnknown(t *testing.T) {
	c := &Checker{Path: "/ping"}
	if st, ok := c.Status("http://nobody"); ok || st != (Status{}) {
		t.Errorf("unknown: got %+v %v, want zero, false", st, ok)
	}
	c.Add("http://a/")
	want := Status{Healthy: true, Probe: "http://a/ping"}
	if st, ok := c.Status("http://a/"); !ok || st != want {
		t.Errorf("new replica: got %+v %v, want %+v, true", st, ok, want)
	}
}

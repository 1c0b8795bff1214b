package health

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// slowHealth is a replica whose /health takes Delay (while slow is set)
// or answers at once.
type slowHealth struct{ slow atomic.Bool }

func (s *slowHealth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.slow.Load() {
		select {
		case <-time.After(1500 * time.Millisecond): // the slow /health
		case <-r.Context().Done():
			return
		}
	}
	if r.URL.Path == "/v1/models" {
		w.Write([]byte(`{"object":"list","data":[{"id":"m"}]}`))
	}
}

// timedTransport serves requests in-process like handlerTransport, and
// fails one whose context ended before the handler returned, as a real
// client does at its timeout.
type timedTransport struct{ h http.Handler }

func (t timedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := handlerTransport(t).RoundTrip(r)
	if err == nil && r.Context().Err() != nil {
		return nil, r.Context().Err()
	}
	return resp, err
}

// record collects a Checker's routability changes, panic transitions and
// overrules.
type record struct {
	mu        sync.Mutex
	routable  map[string]bool
	panics    []bool
	overrules map[string]int
}

func (r *record) hook(c *Checker) {
	r.routable, r.overrules = map[string]bool{}, map[string]int{}
	c.OnChange = func(id string, ok bool) { r.locked(func() { r.routable[id] = ok }) }
	c.OnPanic = func(on bool, _, _ int) { r.locked(func() { r.panics = append(r.panics, on) }) }
	c.OnOverrule = func(id, _ string) { r.locked(func() { r.overrules[id]++ }) }
}

// locked runs f with r.mu held.
func (r *record) locked(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f()
}

func (r *record) get() (routable map[string]bool, panics []bool, overrules map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	routable, overrules = map[string]bool{}, map[string]int{}
	for k, v := range r.routable {
		routable[k] = v
	}
	for k, v := range r.overrules {
		overrules[k] = v
	}
	return routable, append([]bool(nil), r.panics...), overrules
}

// TestRequestsOutvoteProbes: every replica's /health takes 1.5 s, past
// the 1 s probe timeout. Replica a, whose requests succeed, is never
// ejected (the probes overruled once); b and c, without requests, are.
// Then 1 of 3 replicas is healthy, below the 50% panic threshold: b and c
// are routable again, though not healthy. b's requests then fail and c
// refuses a connection: each leaves the panic set. When /health is fast
// again, b and c return and panic mode ends.
func TestRequestsOutvoteProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var h slowHealth
		h.slow.Store(true)
		c := &Checker{Client: &http.Client{Transport: timedTransport{&h}}, Interval: time.Second, Timeout: time.Second}
		var rec record
		rec.hook(c)
		const a, b, cc = "http://a", "http://b", "http://c"
		for _, id := range []string{a, b, cc} {
			c.Add(id)
		}
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		wg.Go(func() { c.Run(ctx) })
		wg.Go(func() { // a's requests: one succeeds every 100 ms
			for ctx.Err() == nil {
				c.ReportSuccess(a)
				time.Sleep(100 * time.Millisecond) // synctest: the request rate
			}
		})
		time.Sleep(10 * time.Second) // synctest: ten probe periods
		routable, panics, overrules := rec.get()
		if !c.Healthy(a) || c.Healthy(b) || c.Healthy(cc) {
			t.Fatalf("healthy a, b, c = %v %v %v; want true false false", c.Healthy(a), c.Healthy(b), c.Healthy(cc))
		}
		if overrules[a] != 1 || overrules[b] != 0 {
			t.Errorf("overrules %v, want a's probes overruled once", overrules)
		}
		if len(panics) != 1 || !panics[0] || !c.Panic() {
			t.Fatalf("panic transitions %v, Panic %v; want on", panics, c.Panic())
		}
		for _, id := range []string{a, b, cc} {
			if !c.Routable(id) {
				t.Errorf("%s not routable in panic mode", id)
			}
		}
		if ok, seen := routable[b]; !ok || !seen {
			t.Errorf("OnChange last told b routable=%v (seen %v), want true", ok, seen)
		}

		for range DefaultConsecutive {
			c.ReportFailure(b)
		}
		c.Eject(cc, "connect: connection refused")
		if c.Routable(b) || c.Routable(cc) {
			t.Errorf("routable b, c = %v %v after b's requests failed and c refused, want false", c.Routable(b), c.Routable(cc))
		}
		if st, _ := c.Status(b); !strings.Contains(st.Reason, "panic mode") {
			t.Errorf("b's reason %q, want its passive ejection in panic mode", st.Reason)
		}

		h.slow.Store(false)
		time.Sleep(DefaultEjectMax + 2*time.Second) // synctest: past the ejections
		if !c.Healthy(b) || !c.Healthy(cc) || c.Panic() {
			t.Errorf("after /health recovered: healthy b %v, c %v, panic %v; want true true false", c.Healthy(b), c.Healthy(cc), c.Panic())
		}
		if _, panics, _ := rec.get(); len(panics) != 2 || panics[1] {
			t.Errorf("panic transitions %v, want on then off", panics)
		}
	})
}

// TestPanicThreshold: below the threshold only; a negative threshold
// never panics; a replica ejected because nothing listens is not in the
// panic set.
func TestPanicThreshold(t *testing.T) {
	for _, tt := range []struct {
		name      string
		threshold float64
		ejected   int // of 4, by probes
		want      bool
	}{
		{"half healthy", 0, 2, false},
		{"one of four", 0, 3, true},
		{"none", 0, 4, true},
		{"never", -1, 4, false},
		{"three quarters", 0.8, 1, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := &Checker{Outlier: Outlier{PanicThreshold: tt.threshold}}
				ids := []string{"http://r0", "http://r1", "http://r2", "http://r3"}
				for _, id := range ids {
					c.Add(id)
				}
				for _, id := range ids[:tt.ejected] {
					c.failed(c.target(id), &statusError{url: id + "/health", code: 503, status: "503 Service Unavailable"})
					c.failed(c.target(id), &statusError{url: id + "/health", code: 503, status: "503 Service Unavailable"})
				}
				if c.Panic() != tt.want {
					t.Errorf("Panic = %v, want %v", c.Panic(), tt.want)
				}
				if tt.want && !c.Routable(ids[0]) {
					t.Errorf("%s, ejected by probes, not routable in panic mode", ids[0])
				}
			})
		})
	}
}

// TestProbeKind: a probe refused by a closed port is a connect failure
// (the replica is gone), a slow one a probe failure.
func TestProbeKind(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	c := &Checker{Timeout: time.Second}
	_, _, err := c.get(t.Context(), url+"/health", 1)
	if err == nil {
		t.Fatal("probe of a closed port succeeded")
	}
	if k := probeKind(err); k != KindConnect {
		t.Errorf("refused probe (%v): kind %s, want %s", err, k, KindConnect)
	}
	if k := probeKind(context.DeadlineExceeded); k != KindProbe {
		t.Errorf("timed-out probe: kind %s, want %s", k, KindProbe)
	}
}

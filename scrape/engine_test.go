package scrape

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/wait"
)

// TestScraperLlamaCpp scrapes a loopback server that answers as
// llama-server does (--metrics, /slots) and one whose page has no family
// the router reads: the first's load carries its engine, slots and slot
// context; the second is reported to OnUnknown once however often it is
// scraped.
func TestScraperLlamaCpp(t *testing.T) {
	var slotsAsked atomic.Int64
	metrics := serveFile(t, "llamacpp.txt")
	lcpp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slots" {
			slotsAsked.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`[{"id":0,"n_ctx":4096,"is_processing":false},{"id":1,"n_ctx":4096,"is_processing":true}]`))
			return
		}
		metrics.ServeHTTP(w, r)
	}))
	defer lcpp.Close()
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3\n"))
	}))
	defer other.Close()

	var mu sync.Mutex
	var last Load
	scrapes := map[string]int{}
	unknown := map[string]int{}
	s := &Scraper{
		Interval: 5 * time.Millisecond, ModelsInterval: -1,
		OnLoad: func(id string, l Load) {
			mu.Lock()
			defer mu.Unlock()
			scrapes[id]++
			if id == lcpp.URL {
				last = l
			}
		},
		OnUnknown: func(id string) {
			mu.Lock()
			defer mu.Unlock()
			unknown[id]++
		},
	}
	s.Add(lcpp.URL)
	s.Add(other.URL)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	wait.For(t, "three scrapes of each replica", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return scrapes[other.URL] >= 3 && scrapes[lcpp.URL] >= 3
	})
	cancel()
	<-done

	mu.Lock()
	defer mu.Unlock()
	if last.Engine != EngineLlamaCpp || last.Slots != 2 || last.SlotContext != 4096 || last.Running != 2 || last.Waiting != 3 {
		t.Errorf("llama.cpp load = %+v, want engine llamacpp, 2 slots of 4096, 2 running, 3 waiting", last)
	}
	if n := slotsAsked.Load(); n != 1 {
		t.Errorf("/slots read %d times over %d scrapes, want once per model-list period", n, scrapes[lcpp.URL])
	}
	if unknown[other.URL] != 1 || unknown[lcpp.URL] != 0 {
		t.Errorf("OnUnknown calls = %v, want one for %s only", unknown, other.URL)
	}
}

// TestSlotsErrors: a /slots answer that is not a list of slots, or an
// empty one (the endpoint off), is an error.
func TestSlotsErrors(t *testing.T) {
	for _, body := range []string{`{"error":"off"}`, `[]`, `not json`} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(body)) }))
		fetch := func(ctx context.Context, url string) (io.ReadCloser, error) {
			resp, err := get(ctx, nil, url, "application/json")
			if err != nil {
				return nil, err
			}
			return resp.Body, nil
		}
		if n, _, err := Slots(context.Background(), fetch, srv.URL); err == nil {
			t.Errorf("Slots(%q) = %d slots, want an error", body, n)
		}
		srv.Close()
	}
}

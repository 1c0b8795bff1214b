package scrape

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvrouter/kvrouter/internal/wait"
)

// serveFile returns a handler serving testdata/name as Prometheus text.
func serveFile(t *testing.T, name string) http.Handler {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		w.Write(b)
	})
}

// TestScraperLive scrapes real loopback servers in vLLM and SGLang format
// and a dead one, and checks loads, errors and staleness.
func TestScraperLive(t *testing.T) {
	vllm := httptest.NewServer(serveFile(t, "vllm.txt"))
	defer vllm.Close()
	sgl := httptest.NewServer(serveFile(t, "sglang.txt"))
	defer sgl.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()

	var mu sync.Mutex
	loads := map[string]Load{}
	errs := map[string]int{}
	done := make(chan struct{})
	s := &Scraper{
		Interval: 10 * time.Millisecond,
		OnLoad: func(id string, l Load) {
			mu.Lock()
			defer mu.Unlock()
			loads[id] = l
		},
		OnError: func(id string, err error) {
			mu.Lock()
			defer mu.Unlock()
			errs[id]++
			if errs[id] == 3 {
				close(done)
			}
		},
	}
	for _, id := range []string{vllm.URL, sgl.URL + "/", deadURL} {
		s.Add(id)
	}
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error)
	go func() { ran <- s.Run(ctx) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("no 3 errors from the dead server within 10 s")
	}
	// Wait for both live servers to have been scraped at least once.
	wait.For(t, "both live servers scraped", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(loads) == 2
	})
	cancel()
	if err := <-ran; !errors.Is(err, context.Canceled) {
		t.Errorf("Run returned %v, want context.Canceled", err)
	}

	mu.Lock()
	defer mu.Unlock()
	if got := loads[vllm.URL]; got.Running != 5 || got.NumBlocks != 54000 || got.At.IsZero() {
		t.Errorf("vllm load = %+v, want Running 5, NumBlocks 54000, At set", got)
	}
	if got := loads[sgl.URL+"/"]; got.Running != 10 || got.Waiting != 2 {
		t.Errorf("sglang load = %+v, want Running 10, Waiting 2", got)
	}
	if _, ok := loads[deadURL]; ok {
		t.Errorf("dead server produced a load")
	}
	st, ok := s.Status(deadURL)
	if !ok || st.Errors < 3 || st.Err == nil || !st.Last.At.IsZero() {
		t.Errorf("dead status = %+v (ok %v), want >= 3 errors, no success", st, ok)
	}
	if age := st.Age(time.Now()); age < time.Hour {
		t.Errorf("dead Age = %v, want huge", age)
	}
	st, _ = s.Status(vllm.URL)
	if st.Errors != 0 || st.Err != nil || st.Age(time.Now()) > 5*time.Second {
		t.Errorf("vllm status = %+v, want fresh with no errors", st)
	}
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

// TestScraperTiming checks the polling period, the offset, consecutive error
// counting and Remove on a fake clock.
func TestScraperTiming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var failing atomic.Bool
		ok := serveFile(t, "vllm-old.txt")
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if failing.Load() {
				http.Error(w, "down", http.StatusServiceUnavailable)
				return
			}
			ok.ServeHTTP(w, r)
		})
		var loads, errs atomic.Int64
		s := &Scraper{
			Client:  &http.Client{Transport: handlerTransport{h}},
			OnLoad:  func(string, Load) { loads.Add(1) },
			OnError: func(string, error) { errs.Add(1) },
		}
		const id = "http://replica-a:8000"
		s.Add(id)
		start := time.Now()
		ctx, cancel := context.WithCancel(t.Context())
		go s.Run(ctx)

		time.Sleep(time.Nanosecond) // synctest: advances the bubble's clock
		synctest.Wait()
		if got := loads.Load(); got != 1 {
			t.Fatalf("at start: %d loads, want 1 (a replica is scraped as soon as it is added)", got)
		}
		time.Sleep(950*time.Millisecond - time.Since(start)) // synctest: advances the bubble's clock
		synctest.Wait()
		if got := loads.Load(); got != 10 {
			t.Errorf("after 0.95 s: %d loads, want 10", got)
		}

		failing.Store(true)
		time.Sleep(500 * time.Millisecond) // synctest: advances the bubble's clock
		synctest.Wait()
		st, _ := s.Status(id)
		if st.Errors != 5 || errs.Load() != 5 {
			t.Errorf("after 0.5 s failing: status errors %d, hook errors %d, want 5", st.Errors, errs.Load())
		}
		if age := st.Age(time.Now()); age < 500*time.Millisecond || age > 600*time.Millisecond {
			t.Errorf("load age %v, want 0.5..0.6 s (last success before the failures began)", age)
		}
		if st.Last.Running != 7 {
			t.Errorf("last good load Running %d, want 7", st.Last.Running)
		}

		failing.Store(false)
		time.Sleep(100 * time.Millisecond) // synctest: advances the bubble's clock
		synctest.Wait()
		if st, _ := s.Status(id); st.Errors != 0 || st.Err != nil {
			t.Errorf("after recovery: %+v, want no errors", st)
		}

		s.Remove(id)
		n := loads.Load()
		time.Sleep(time.Second) // synctest: advances the bubble's clock
		synctest.Wait()
		if got := loads.Load(); got != n {
			t.Errorf("removed target scraped %d more times", got-n)
		}
		cancel()
		synctest.Wait()
	})
}

func TestOffset(t *testing.T) {
	seen := map[time.Duration]bool{}
	for _, id := range []string{"http://a:1", "http://a:2", "http://b:1", "http://c:1"} {
		o := Offset(id, DefaultInterval)
		if o < 0 || o >= DefaultInterval {
			t.Errorf("Offset(%q) = %v, want in [0, %v)", id, o, DefaultInterval)
		}
		seen[o] = true
	}
	if len(seen) < 4 {
		t.Errorf("offsets collide: %v", seen)
	}
	if got := Offset("x", 0); got != 0 {
		t.Errorf("Offset with zero interval = %v, want 0", got)
	}
}

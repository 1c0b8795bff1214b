package scrape

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// idlePage serves a vLLM page whose running count the test sets and whose
// process CPU counter moves at every request (a family Parse does not
// read), and records when it was asked, from start.
type idlePage struct {
	start   time.Time
	running atomic.Int64
	served  atomic.Int64
	mu      sync.Mutex
	at      []time.Duration
}

func (p *idlePage) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	p.at = append(p.at, time.Since(p.start))
	p.mu.Unlock()
	n := p.served.Add(1)
	fmt.Fprintf(w, "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %d\n"+
		"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} %d\n", n, p.running.Load())
}

// times returns when the page was asked, from start.
func (p *idlePage) times() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.at)
}

// traffic stands for the router's requests to one replica: Activity's
// channel, closed by send (as fleet.Fleet.Activity's is by a request).
type traffic struct {
	mu sync.Mutex
	ch chan struct{}
}

func (tr *traffic) activity(string) <-chan struct{} {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.ch = make(chan struct{})
	return tr.ch
}

func (tr *traffic) send() {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.ch != nil {
		close(tr.ch)
		tr.ch = nil
	}
}

// ms is a list of milliseconds as durations.
func ms(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

// TestScraperIdleBackoff: the scrapes of a page whose load families do not
// change (its other families do) back off, doubling the gap up to
// IdleInterval, and come back to every Interval once the load changes,
// delivering every load, on a fake clock.
func TestScraperIdleBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &idlePage{start: time.Now()}
		p.running.Store(2)
		var mu sync.Mutex
		var running []int
		s := &Scraper{
			Client:         &http.Client{Transport: handlerTransport{p}},
			IdleInterval:   500 * time.Millisecond,
			ModelsInterval: -1,
			OnLoad: func(_ string, l Load) {
				mu.Lock()
				defer mu.Unlock()
				running = append(running, l.Running)
			},
		}
		s.Add("http://r")
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go s.Run(ctx)
		time.Sleep(2750 * time.Millisecond) // synctest: advances the bubble's clock
		p.running.Store(3)
		time.Sleep(850 * time.Millisecond) // synctest: advances the bubble's clock
		synctest.Wait()

		want := ms(0, 100, 300, 700, 1200, 1700, 2200, 2700, 3200, 3300, 3500)
		if got := p.times(); !slices.Equal(got, want) {
			t.Errorf("scraped at %v, want %v", got, want)
		}
		mu.Lock()
		defer mu.Unlock()
		if want := []int{2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3}; !slices.Equal(running, want) {
			t.Errorf("loads delivered with Running %v, want %v", running, want)
		}
	})
}

// TestScraperTrafficFresh: with the router's traffic on a replica its
// scrapes are those of a scraper without backoff, and the first after the
// traffic starts comes at the start of the next Interval, as it would
// without backoff, on a fake clock.
func TestScraperTrafficFresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		backoff, fixed := &idlePage{start: start}, &idlePage{start: start}
		tr := &traffic{}
		for _, s := range []*Scraper{
			{Client: &http.Client{Transport: handlerTransport{backoff}}, IdleInterval: 500 * time.Millisecond, Activity: tr.activity, ModelsInterval: -1},
			{Client: &http.Client{Transport: handlerTransport{fixed}}, ModelsInterval: -1},
		} {
			s.Add("http://r")
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			go s.Run(ctx)
		}
		time.Sleep(2050 * time.Millisecond) // synctest: idle until 2.05 s, in the 400 ms left out after the scrape at 1.7 s
		for range 32 {
			tr.send()
			time.Sleep(30 * time.Millisecond) // synctest: a request every 30 ms
		}
		synctest.Wait()

		if got, want := backoff.times(), ms(0, 100, 300, 700, 1200, 1700); !slices.Equal(got[:min(len(got), 6)], want) {
			t.Errorf("idle: scraped at %v, want %v first", got, want)
		}
		busy := func(at []time.Duration) []time.Duration {
			return slices.DeleteFunc(at, func(d time.Duration) bool { return d < 2050*time.Millisecond })
		}
		got, want := busy(backoff.times()), busy(fixed.times())
		if len(want) != 10 || want[0] != 2100*time.Millisecond || !slices.Equal(got, want) {
			t.Errorf("with traffic from 2.05 s: scraped at %v, want %v, as without backoff (10 from 2.1 s)", got, want)
		}
	})
}

// TestScraperNoBackoff: an IdleInterval under two Intervals scrapes an
// unchanged page at every Interval.
func TestScraperNoBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &idlePage{start: time.Now()}
		s := &Scraper{Client: &http.Client{Transport: handlerTransport{p}}, IdleInterval: 150 * time.Millisecond, ModelsInterval: -1}
		s.Add("http://r")
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		go s.Run(ctx)
		time.Sleep(450 * time.Millisecond) // synctest: advances the bubble's clock
		synctest.Wait()
		if got, want := p.times(), ms(0, 100, 200, 300, 400); !slices.Equal(got, want) {
			t.Errorf("scraped at %v, want %v", got, want)
		}
	})
}

package dashboard

import (
	"context"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/view"

	"github.com/chromedp/chromedp"
)

// incident is a Source whose replica 0 completes 3 requests a second from
// start on and fails 1 a second during the ten minutes from start.
type incident struct {
	base  *literal
	start time.Time
}

func (s *incident) Fleet(now time.Time) view.Fleet {
	f := s.base.Fleet(now)
	since := now.Sub(s.start)
	r := &f.Replicas[0]
	r.Completed = int64(3 * since.Seconds())
	r.Failed = int64(min(max(since, 0), 10*time.Minute).Seconds())
	f.Decisions = uint64(r.Completed + r.Failed)
	f.Requests, f.RequestsFailed = r.Completed+r.Failed, r.Failed
	return f
}

func (s *incident) Decisions(n int) []view.Decision { return nil }

// TestBrowserShowsHistoryBeforeLoad: the router samples while nobody
// watches (the ring filled as Run fills it, one sample per SeriesStep for
// the 50 minutes before the page loads, an incident of failures in the
// first ten), and a page loaded afterwards draws that hour: on the 1h
// range its charts start 50 minutes before the load and its error-rate
// tile counts the incident's failures; on the 5m range neither.
func TestBrowserShowsHistoryBeforeLoad(t *testing.T) {
	load := time.Now()
	src := &incident{base: sample(), start: load.Add(-50 * time.Minute)}
	h := newHandler(src)
	for at := src.start; at.Before(load); at = at.Add(SeriesStep) {
		h.hist.record(at, func() view.Fleet { return src.Fleet(at) }, h.recent)
	}
	srv := httptest.NewServer(h.mux)
	defer srv.Close()
	ctx, con := startBrowser(t)
	within(t, ctx, 20*time.Second, "navigate", chromedp.Navigate(srv.URL+"/ui?refresh=100"))

	oldest := func() int64 {
		return within(t, ctx, 10*time.Second, "oldest sample drawn", chromedp.Poll[int64](`+(document.querySelector('#chart-rate svg') || {dataset: {}}).dataset.oldest || false`))
	}
	errRate := func() float64 {
		s := within(t, ctx, 5*time.Second, "error-rate tile", chromedp.Evaluate[string](
			`[...document.querySelectorAll('#totals .card')].filter(c => c.querySelector('.label').textContent === 'Error rate').map(c => c.querySelector('.value').textContent).join()`))
		v, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
		if err != nil {
			t.Fatalf("error-rate tile %q: %v", s, err)
		}
		return v
	}
	// The default range: the last five minutes, no failures in them.
	if got, from := oldest(), load.Add(-5*time.Minute-SeriesStep).UnixMilli(); got < from {
		t.Errorf("5m range draws a sample from %v, before %v", time.UnixMilli(got), time.UnixMilli(from))
	}
	if got := errRate(); got != 0 {
		t.Errorf("error rate over the last 5 minutes %v%%, want 0", got)
	}

	within(t, ctx, 5*time.Second, "1h", chromedp.Evaluate[chromedp.Void](`document.querySelector('#range button[data-range="1h"]').click()`))
	within(t, ctx, 10*time.Second, "1h drawn", chromedp.Poll[bool](`document.getElementById('series-title').textContent === 'Last hour'`))
	before := load.Add(-49 * time.Minute).UnixMilli()
	wait.For(t, "a sample from 49 minutes before the page loaded, drawn", func() bool { return oldest() < before })
	if got := oldest(); got < src.start.UnixMilli() {
		t.Errorf("oldest sample drawn at %v, before the first taken (%v)", time.UnixMilli(got), src.start)
	}
	// 600 failed of 9,600 finished in the 50 minutes (6.25%), a little
	// less as the page's own samples add completions.
	if got := errRate(); got < 6.0 || got > 6.3 {
		t.Errorf("error rate over the last hour %v%%, want 6.0..6.3", got)
	}
	// Every replica's name is shown whole: not cut, not overflowing its
	// box (it wraps).
	cut := within(t, ctx, 5*time.Second, "replica names", chromedp.Evaluate[[]string](`[...document.querySelectorAll('#replica-hits .mini')].filter(m => { const r = m.querySelector('.rid'); return !r || r.textContent !== m.dataset.replica || r.scrollWidth > r.clientWidth + 1 || r.getBoundingClientRect().right > m.getBoundingClientRect().right + 1 }).map(m => m.dataset.replica)`))
	if len(cut) > 0 {
		t.Errorf("replica names cut or overflowing: %v", cut)
	}
	if errs := con.Errors(); len(errs) > 0 {
		t.Errorf("console errors:\n%v", errs)
	}
}

// TestRunSamplesUnwatched: Handler.Run keeps sampling with nobody polling,
// one sample per step, and stops when its context ends.
func TestRunSamplesUnwatched(t *testing.T) {
	src := &incident{base: sample(), start: time.Now()}
	h := newHandler(src)
	h.hist = newHistory(20*time.Millisecond, time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { (&Handler{h}).Run(ctx); close(done) }()
	wait.For(t, "five samples taken unwatched", func() bool { return len(h.hist.points(time.Second)) >= 5 })
	cancel()
	<-done
	n := len(h.hist.points(time.Second))
	time.Sleep(60 * time.Millisecond) // a quiet period in which no sample may come: the behaviour under test
	if got := len(h.hist.points(time.Second)); got != n {
		t.Errorf("%d samples after Run returned, then %d", n, got)
	}
}

// TestHistoryMemory fills a ring of the defaults (SeriesWindow of
// SeriesStep samples) from a fleet of MaxSeriesReplicas replicas whose
// every interval has data, and checks the heap it holds is about the
// 16 MB series.go states (under 20 MB; 15.9 MB measured when written):
//
//	go test -run TestHistoryMemory -v ./dashboard
func TestHistoryMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("fills an hour of samples")
	}
	f := view.Fleet{}
	for i := range MaxSeriesReplicas + 10 {
		f.Replicas = append(f.Replicas, view.Replica{ID: "http://10.0.0." + strconv.Itoa(i) + ":8000"})
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	h := newHistory(SeriesStep, SeriesWindow)
	n := int(SeriesWindow / SeriesStep)
	for k := range n + 5 {
		for i := range f.Replicas {
			r := &f.Replicas[i]
			r.Completed, r.Failed, r.PromptTokens, r.ActualCached, r.PredictedCached = int64(k*3), int64(k), int64(k*1000), int64(k*500), int64(k*600)
		}
		at := t0.Add(time.Duration(k) * SeriesStep)
		h.record(at, func() view.Fleet { return f }, func() []view.Decision { return nil })
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	runtime.KeepAlive(h)
	t.Logf("%d samples of %d replicas hold %.1f MB", len(h.points(SeriesWindow)), MaxSeriesReplicas, float64(held)/1e6)
	if held > 20e6 {
		t.Errorf("the full ring holds %d bytes, far over the 16 MB stated", held)
	}
}

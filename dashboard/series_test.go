package dashboard

import (
	"encoding/json"
	"math"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/google/go-cmp/cmp"

	"github.com/kvrouter/kvrouter/view"
)

// clock is a settable time for the handler. mu guards at.
type clock struct {
	mu sync.Mutex
	at time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.at
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at = t
}

// twoReplicas is a fleet of replicas a and b with the given cumulative
// counters: completed, prompt, actual and predicted cached tokens.
func twoReplicas(decisions uint64, a, b [4]int64) view.Fleet {
	rep := func(id string, c [4]int64) view.Replica {
		return view.Replica{ID: id, Healthy: true, Completed: c[0], PromptTokens: c[1], ActualCached: c[2], PredictedCached: c[3]}
	}
	return view.Fleet{Policy: "kv-aware", Decisions: decisions, Replicas: []view.Replica{rep("a", a), rep("b", b)}}
}

// getSeries fetches /ui/api/series.
func getSeries(t *testing.T, url string) seriesJSON {
	t.Helper()
	resp, body := get(t, url+"/ui/api/series")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var s seriesJSON
	if err := json.Unmarshal([]byte(body), &s); err != nil {
		t.Fatalf("%v: %s", err, body)
	}
	return s
}

func val(p *float64) float64 {
	if p == nil {
		return math.NaN()
	}
	return *p
}

// TestSeries drives the handler's clock through three samples two
// seconds apart, a poll too soon after one, a replica's counter reset and
// a pause, and checks every figure of /ui/api/series against the counters'
// differences and the decisions' TTFTs.
func TestSeries(t *testing.T) {
	src := &literal{fleet: twoReplicas(0, [4]int64{}, [4]int64{})}
	h := newHandler(src)
	clk := &clock{at: t0}
	h.now = clk.now
	srv := httptest.NewServer(h.mux)
	defer srv.Close()

	get(t, srv.URL+"/ui/api/fleet") // sample 0 at t0
	// 2 s later: 10 decisions (5/s); a completed 4 requests of 4000 prompt
	// tokens, 3000 cached, 2000 predicted; b 2 of 1000, none cached. Three
	// TTFTs landed in the interval (10, 20 and 30 ms, two predicted), one
	// before it and one still in flight.
	src.update(func(f *view.Fleet, ds *[]view.Decision) {
		*f = twoReplicas(10, [4]int64{4, 4000, 3000, 2000}, [4]int64{2, 1000, 0, 0})
		*ds = []view.Decision{
			{ID: "5", At: t0.Add(1900 * time.Millisecond), TTFTMS: 30, PredictedTTFTMS: 33},
			{ID: "4", At: t0.Add(time.Second), TTFTMS: 20, PredictedTTFTMS: 18},
			{ID: "3", At: t0.Add(500 * time.Millisecond), TTFTMS: 10},
			{ID: "2", At: t0.Add(-time.Second), TTFTMS: 5},
			{ID: "1", At: t0.Add(time.Second)}, // in flight
		}
	})
	clk.set(t0.Add(2 * time.Second))
	get(t, srv.URL+"/ui/api/fleet")
	clk.set(t0.Add(3 * time.Second)) // too soon: no sample
	get(t, srv.URL+"/ui/api/fleet")
	// b restarted (its counters went down): no figure for it this time.
	src.update(func(f *view.Fleet, ds *[]view.Decision) {
		*f = twoReplicas(16, [4]int64{10, 10000, 9000, 8000}, [4]int64{0, 0, 0, 0})
		*ds = nil
	})
	clk.set(t0.Add(4 * time.Second))
	s := getSeries(t, srv.URL)
	// A pause of a minute: the next sample spans it.
	clk.set(t0.Add(64 * time.Second))
	p := getSeries(t, srv.URL)

	if len(s.At) != 3 {
		t.Fatalf("%d samples, want 3 (t0, +2 s, +4 s): %v", len(s.At), s.At)
	}
	if s.StepMS != 2000 || s.WindowMS != 300000 {
		t.Errorf("step %v ms, window %v ms, want 2000 and 300000", s.StepMS, s.WindowMS)
	}
	checks := []struct {
		name string
		got  *float64
		want float64 // NaN: null
	}{
		{"requests/s first", s.Requests[0], math.NaN()},
		{"requests/s", s.Requests[1], 5},
		{"requests/s after", s.Requests[2], 3},
		{"completed/s", s.Completed[1], 3},
		{"hit actual", s.HitActual[1], 3000.0 / 5000},
		{"hit predicted", s.HitPred[1], 2000.0 / 5000},
		{"ttft p50", s.TTFTP50[1], 20},
		{"ttft p99", s.TTFTP99[1], 30},
		{"ttft predicted p50", s.PredP50[1], 18},
		{"ttft none", s.TTFTP50[2], math.NaN()},
		{"a completed/s", s.Replicas[0].Completed[1], 2},
		{"a hit actual", s.Replicas[0].HitActual[1], 0.75},
		{"a hit predicted", s.Replicas[0].HitPred[1], 0.5},
		{"b hit actual", s.Replicas[1].HitActual[1], 0},
		{"b completed/s", s.Replicas[1].Completed[1], 1},
		{"a after b's reset", s.Replicas[0].HitActual[2], 6000.0 / 6000},
		{"b after its reset", s.Replicas[1].Completed[2], math.NaN()},
		{"fleet after b's reset", s.HitActual[2], 6000.0 / 6000},
		{"after the pause", p.Requests[3], 0},
	}
	for _, c := range checks {
		got := val(c.got)
		if math.IsNaN(c.want) != math.IsNaN(got) || !math.IsNaN(got) && math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: got %v, want %v", c.name, got, c.want)
		}
	}
	if s.TTFTs[1] != 3 {
		t.Errorf("%d TTFTs in the interval, want 3", s.TTFTs[1])
	}
	if len(p.SpanMS) != 4 || p.SpanMS[3] != 60000 {
		t.Errorf("spans %v, want a 60000 ms one after the pause", p.SpanMS)
	}
	if want := t0.Add(64 * time.Second).UnixMilli(); p.At[3] != want {
		t.Errorf("last sample at %d, want %d", p.At[3], want)
	}
}

// TestSeriesBounded: the ring keeps SeriesWindow/SeriesStep samples and
// drops the oldest.
func TestSeriesBounded(t *testing.T) {
	h := newHistory(SeriesStep, SeriesWindow)
	n := int(SeriesWindow / SeriesStep)
	for i := range n + 25 {
		at := t0.Add(time.Duration(i) * SeriesStep)
		h.record(at, func() view.Fleet { return twoReplicas(uint64(i), [4]int64{}, [4]int64{}) }, func() []view.Decision { return nil })
	}
	ps := h.points(SeriesWindow)
	if len(ps) != n || cap(h.ring) != n {
		t.Fatalf("%d points (ring capacity %d), want %d", len(ps), cap(h.ring), n)
	}
	if want := t0.Add(25 * SeriesStep); !ps[0].At.Equal(want) {
		t.Errorf("oldest point at %v, want %v", ps[0].At, want)
	}
	for i := 1; i < len(ps); i++ {
		if !ps[i].At.After(ps[i-1].At) {
			t.Fatalf("points out of order at %d: %v after %v", i, ps[i].At, ps[i-1].At)
		}
	}
}

// TestSeriesReplicaCap: per-replica counters are kept for at most
// MaxSeriesReplicas replicas however large the fleet.
func TestSeriesReplicaCap(t *testing.T) {
	f := view.Fleet{}
	for i := range MaxSeriesReplicas + 100 {
		f.Replicas = append(f.Replicas, view.Replica{ID: string(rune('a' + i%26))})
	}
	h := newHistory(SeriesStep, SeriesWindow)
	h.record(t0, func() view.Fleet { return f }, func() []view.Decision { return nil })
	if got := len(h.points(SeriesWindow)[0].reps); got != MaxSeriesReplicas {
		t.Errorf("%d replicas sampled, want %d", got, MaxSeriesReplicas)
	}
}

// traffic is a Source whose counters grow with the time it is asked about:
// per second of the clock since t0, 5 decisions and, on the sample
// fleet's replicas 0 and 1, 3 and 2 completions of 1,000 prompt tokens
// each, 2/3 and 1/4 of them cached (0.7 and 0.3 predicted); its decisions
// are three requests half a second before the last Fleet call, with TTFTs
// of 20, 40 and 90 ms (30 ms predicted). wave, if set, swings the rates
// over time for a livelier screenshot. mu guards last.
type traffic struct {
	mu   sync.Mutex
	last time.Time
	base *literal
	wave bool
}

func (s *traffic) Fleet(now time.Time) view.Fleet {
	s.mu.Lock()
	s.last = now
	s.mu.Unlock()
	f := s.base.Fleet(now)
	sec := now.Sub(t0).Seconds()
	if s.wave { // the rates swing between 0 and twice their mean
		sec += 20 * math.Sin(sec/20)
	}
	grow := func(rate float64) int64 { return int64(rate * sec) }
	f.Decisions = uint64(grow(5))
	for i, r := range []struct{ done, hit, pred float64 }{{3, 2.0 / 3, 0.7}, {2, 0.25, 0.3}} {
		rep := &f.Replicas[i]
		rep.Completed, rep.PromptTokens = grow(r.done), grow(r.done*1000)
		rep.ActualCached, rep.PredictedCached = grow(r.done*1000*r.hit), grow(r.done*1000*r.pred)
	}
	return f
}

func (s *traffic) Decisions(n int) []view.Decision {
	s.mu.Lock()
	at := s.last.Add(-500 * time.Millisecond)
	s.mu.Unlock()
	d := func(id, replica string, ttft float64) view.Decision {
		return view.Decision{ID: id, At: at, Session: "s-" + id, Policy: "kv-aware", Model: "m", Tokens: 1000, Blocks: 62,
			Replica: replica, Reason: "prefix", PredictedCached: 700, ActualCached: 667, PromptTokens: 1000,
			TTFTMS: ttft, PredictedTTFTMS: 30, E2EMS: 300, Status: 200, Outcome: "ok"}
	}
	ds := []view.Decision{d("kvr-9-3", "http://10.0.0.1:8000", 20), d("kvr-9-2", "http://10.0.0.1:8000", 40), d("kvr-9-1", "http://10.0.0.2:8000", 90)}
	ds = append(ds, s.base.Decisions(n)...)
	return ds[:min(n, len(ds))]
}

// tickingClock advances by step on every read: with the page polling
// /ui/api/fleet and /ui/api/series each refresh, every refresh is a new
// sample.
type tickingClock struct {
	mu   sync.Mutex
	at   time.Time
	step time.Duration
}

func (c *tickingClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at = c.at.Add(c.step)
	return c.at
}

// TestBrowserSeries opens the page over traffic whose rates are known and
// checks the time series it draws: the three charts have lines, their
// legends show the latest figures (5 routed and 5 completed requests a
// second, TTFT p50 40 ms, p99 90 ms, predicted 30 ms, hit rate 50% actual
// against 54% predicted), every replica gets its hit-rate chart, and the
// console stays clean.
func TestBrowserSeries(t *testing.T) {
	h := newHandler(&traffic{base: sample()})
	clk := &tickingClock{at: t0, step: SeriesStep / 2}
	h.now = clk.now
	srv := httptest.NewServer(h.mux)
	defer srv.Close()
	ctx, con := startBrowser(t)
	within(t, ctx, 20*time.Second, "navigate", chromedp.Navigate(srv.URL+"/ui?refresh=100"))
	for _, id := range []string{"chart-rate", "chart-ttft", "chart-hit"} {
		n := within(t, ctx, 10*time.Second, id, chromedp.Poll[int](`(() => { const s = document.querySelector('#`+id+` svg'); return s && s.querySelectorAll('polyline').length > 0 && +s.dataset.points >= 4 && +s.dataset.points })()`))
		t.Logf("%s: %d points drawn", id, n)
	}
	legend := func(id string) string {
		return within(t, ctx, 5*time.Second, id+" legend", chromedp.Evaluate[string](`[...document.querySelectorAll('#`+id+` .legend span')].map(s => s.textContent).join(" | ")`))
	}
	for _, c := range []struct{ id, want string }{
		{"chart-rate", "routed5.00/s | completed5.00/s | failed0.00/s"},
		{"chart-ttft", "p5040 ms | p9990 ms | predicted p5030 ms"},
		{"chart-hit", "actual50.0% | predicted54.0%"},
	} {
		if got := legend(c.id); got != c.want {
			t.Errorf("%s legend %q, want %q", c.id, got, c.want)
		}
	}
	minis := within(t, ctx, 5*time.Second, "replica charts", chromedp.Evaluate[[]string](`[...document.querySelectorAll('#replica-hits .mini')].map(m => m.dataset.replica + " " + m.querySelector('.name b').textContent + " " + m.querySelectorAll('polyline').length)`))
	want := []string{"http://10.0.0.1:8000 66.7% / 70.0% 2", "http://10.0.0.2:8000 25.0% / 30.0% 2", "http://10.0.0.3:8000 — / — 0"}
	if diff := cmp.Diff(want, minis); diff != "" {
		t.Errorf("replica hit-rate charts (-want +got):\n%s", diff)
	}
	if errs := con.Errors(); len(errs) > 0 {
		t.Errorf("console errors:\n%v", errs)
	}
}

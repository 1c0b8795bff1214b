package dashboard

import (
	"slices"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/view"
)

// Defaults of the time series: one sample per SeriesStep at most, the last
// SeriesWindow kept (SeriesWindow/SeriesStep = 1,800 samples), per-replica
// series for the first MaxSeriesReplicas replicas; /ui/api/series answers
// the last DefaultSeriesRange unless asked for more. A sample costs about
// 140 bytes per replica (its counters, 56 bytes, and its interval figures,
// 88 with the three numbers they point to) plus 200 for the fleet's: the
// ring holds at most 1,800 × (64 × 140 + 200) bytes, about 16 MB
// (TestHistoryMemory measures it).
const (
	SeriesStep         = 2 * time.Second
	SeriesWindow       = time.Hour
	DefaultSeriesRange = 5 * time.Minute
	MaxSeriesReplicas  = 64
)

// history is the dashboard's server-side ring of samples, taken every
// step by Handler.Run and as the page polls (at most one per step): a
// page opened after an incident, or a second viewer, sees the same last
// hour. Without Run nothing is recorded while nobody polls; the first
// sample after a pause covers the pause (its span says how long) and the
// page draws it as a gap. mu guards every field.
type history struct {
	mu    sync.Mutex
	step  time.Duration
	ring  []point // capacity fixed at construction
	start int     // index of the oldest point
	last  *point  // the newest point, nil before the first
}

// point is one sample: the cumulative counters read at At and the figures
// of the interval since the previous sample (Span long; zero for the
// first).
type point struct {
	At   time.Time
	Span time.Duration
	// decisions is the router's cumulative decision count; requests and
	// failed its cumulative client requests (view.Fleet.Requests).
	decisions        uint64
	requests, failed int64
	reps             []repCounters
	// Interval figures; a nil pointer is "no data".
	Requests, Completed *float64
	Failed              *float64
	// Finished and FinishedFailed are client requests per second
	// (view.Fleet.Requests); Completed and Failed attempts.
	Finished, FinishedFailed *float64
	TTFTP50, TTFTP99         *float64
	PredP50                  *float64
	TTFTs                    int
	HitPred, HitActual       *float64
	Reps                     []repPoint
}

// repCounters are one replica's cumulative counters.
type repCounters struct {
	id                                      string
	done, failed, prompt, actual, predicted int64
}

// repPoint is one replica's figures over an interval.
type repPoint struct {
	ID                 string
	Completed          *float64
	HitPred, HitActual *float64
}

// newHistory returns a history of window/step samples.
func newHistory(step, window time.Duration) *history {
	return &history{step: step, ring: make([]point, 0, max(int(window/step), 2))}
}

// record takes a sample at now of the fleet that fleet returns unless the
// newest is younger than the step; fleet and decisions are called only
// when a sample is taken.
func (h *history) record(now time.Time, fleet func() view.Fleet, decisions func() []view.Decision) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.last != nil && now.Sub(h.last.At) < h.step {
		return
	}
	f := fleet()
	p := point{At: now, decisions: f.Decisions, requests: f.Requests, failed: f.RequestsFailed}
	for i := range f.Replicas[:min(len(f.Replicas), MaxSeriesReplicas)] {
		r := &f.Replicas[i]
		p.reps = append(p.reps, repCounters{id: r.ID, done: r.Completed + r.Failed, failed: r.Failed,
			prompt: r.PromptTokens, actual: r.ActualCached, predicted: r.PredictedCached})
	}
	if prev := h.last; prev != nil && now.After(prev.At) {
		p.Span = now.Sub(prev.At)
		p.interval(prev, decisions())
	}
	h.push(p)
}

// interval fills p's figures over the time since prev: rates from the
// counters' differences, TTFTs from the decisions whose first byte came
// in the interval.
func (p *point) interval(prev *point, ds []view.Decision) {
	secs := p.Span.Seconds()
	if p.decisions >= prev.decisions {
		p.Requests = ptr(float64(p.decisions-prev.decisions) / secs)
	}
	if p.requests >= prev.requests && p.failed >= prev.failed {
		p.Finished = ptr(float64(p.requests-prev.requests) / secs)
		p.FinishedFailed = ptr(float64(p.failed-prev.failed) / secs)
	}
	var done, failed, prompt, actual, pred int64
	ok := false
	for _, c := range p.reps {
		rp := repPoint{ID: c.id}
		k := slices.IndexFunc(prev.reps, func(o repCounters) bool { return o.id == c.id })
		if k >= 0 && c.done >= prev.reps[k].done && c.failed >= prev.reps[k].failed && c.prompt >= prev.reps[k].prompt {
			o := prev.reps[k]
			failed += c.failed - o.failed
			rp.Completed = ptr(float64(c.done-o.done) / secs)
			dp := c.prompt - o.prompt
			rp.HitPred, rp.HitActual = ratio(c.predicted-o.predicted, dp), ratio(c.actual-o.actual, dp)
			done, prompt, actual, pred, ok = done+c.done-o.done, prompt+dp, actual+c.actual-o.actual, pred+c.predicted-o.predicted, true
		}
		p.Reps = append(p.Reps, rp)
	}
	if ok {
		p.Completed = ptr(float64(done) / secs)
		p.Failed = ptr(float64(failed) / secs)
		p.HitPred, p.HitActual = ratio(pred, prompt), ratio(actual, prompt)
	}
	var obs, predicted []float64
	for i := range ds {
		d := &ds[i]
		if d.TTFTMS <= 0 {
			continue
		}
		first := d.At.Add(time.Duration(d.TTFTMS * float64(time.Millisecond)))
		if !first.After(prev.At) || first.After(p.At) {
			continue
		}
		obs = append(obs, d.TTFTMS)
		if d.PredictedTTFTMS > 0 {
			predicted = append(predicted, d.PredictedTTFTMS)
		}
	}
	p.TTFTs = len(obs)
	p.TTFTP50, p.TTFTP99, p.PredP50 = nearestRank(obs, 50), nearestRank(obs, 99), nearestRank(predicted, 50)
}

// push appends p, dropping the oldest point when the ring is full. h.mu
// is held.
func (h *history) push(p point) {
	if len(h.ring) < cap(h.ring) {
		h.ring = append(h.ring, p)
		h.last = &h.ring[len(h.ring)-1]
		return
	}
	h.ring[h.start] = p
	h.last = &h.ring[h.start]
	h.start = (h.start + 1) % len(h.ring)
}

// points returns the points of the last span before the newest, oldest
// first, as copies the caller may keep.
func (h *history) points(span time.Duration) []point {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]point, 0, len(h.ring))
	out = append(out, h.ring[h.start:]...)
	out = append(out, h.ring[:h.start]...)
	if len(out) == 0 {
		return out
	}
	from := out[len(out)-1].At.Add(-span)
	k, found := slices.BinarySearchFunc(out, from, func(p point, t time.Time) int { return p.At.Compare(t) })
	if found { // the span is half-open: (newest − span, newest]
		k++
	}
	return out[k:]
}

// nearestRank is the nearest-rank p-th percentile of vs (sorted in
// place), nil when empty.
func nearestRank(vs []float64, p int) *float64 {
	if len(vs) == 0 {
		return nil
	}
	slices.Sort(vs)
	k := (p*len(vs) + 99) / 100
	return ptr(vs[min(max(k, 1), len(vs))-1])
}

func ptr(v float64) *float64 { return &v }

// seriesJSON is the body of /ui/api/series (see API.md): the samples as
// columns, oldest first, each interval figure at the sample that ends its
// interval (null: no data, or the first sample).
type seriesJSON struct {
	StepMS    float64    `json:"step_ms"`
	WindowMS  float64    `json:"window_ms"`
	At        []int64    `json:"t_ms"`
	SpanMS    []float64  `json:"span_ms"`
	Requests  []*float64 `json:"requests_per_s"`
	Completed []*float64 `json:"completed_per_s"`
	Failed    []*float64 `json:"failed_per_s"`
	// Finished and FinishedFailed are client requests, as Completed and
	// Failed are attempts.
	Finished       []*float64      `json:"requests_finished_per_s"`
	FinishedFailed []*float64      `json:"requests_failed_per_s"`
	TTFTP50        []*float64      `json:"ttft_p50_ms"`
	TTFTP99        []*float64      `json:"ttft_p99_ms"`
	PredP50        []*float64      `json:"ttft_predicted_p50_ms"`
	TTFTs          []int           `json:"ttft_samples"`
	HitPred        []*float64      `json:"hit_rate_predicted"`
	HitActual      []*float64      `json:"hit_rate_actual"`
	Replicas       []replicaSeries `json:"replicas"`
}

// replicaSeries is one replica's columns, aligned with seriesJSON's.
type replicaSeries struct {
	ID        string     `json:"id"`
	Completed []*float64 `json:"completed_per_s"`
	HitPred   []*float64 `json:"hit_rate_predicted"`
	HitActual []*float64 `json:"hit_rate_actual"`
}

// seriesOf converts ps (oldest first) for the API; replicas are those of
// the newest point, in its order.
func seriesOf(ps []point, step, window time.Duration) seriesJSON {
	n := len(ps)
	out := seriesJSON{StepMS: ms(step), WindowMS: ms(window), At: make([]int64, n), SpanMS: make([]float64, n),
		Requests: make([]*float64, n), Completed: make([]*float64, n), Failed: make([]*float64, n),
		Finished: make([]*float64, n), FinishedFailed: make([]*float64, n), TTFTP50: make([]*float64, n), TTFTP99: make([]*float64, n),
		PredP50: make([]*float64, n), TTFTs: make([]int, n), HitPred: make([]*float64, n), HitActual: make([]*float64, n),
		Replicas: []replicaSeries{}}
	for i := range ps {
		p := &ps[i]
		out.At[i], out.SpanMS[i] = p.At.UnixMilli(), ms(p.Span)
		out.Requests[i], out.Completed[i], out.Failed[i] = p.Requests, p.Completed, p.Failed
		out.Finished[i], out.FinishedFailed[i] = p.Finished, p.FinishedFailed
		out.TTFTP50[i], out.TTFTP99[i], out.PredP50[i], out.TTFTs[i] = p.TTFTP50, p.TTFTP99, p.PredP50, p.TTFTs
		out.HitPred[i], out.HitActual[i] = p.HitPred, p.HitActual
	}
	if n == 0 {
		return out
	}
	for j, c := range ps[n-1].reps {
		rs := replicaSeries{ID: c.id, Completed: make([]*float64, n), HitPred: make([]*float64, n), HitActual: make([]*float64, n)}
		for i := range ps {
			reps := ps[i].Reps
			k := j // the fleet's order rarely changes
			if k >= len(reps) || reps[k].ID != c.id {
				k = slices.IndexFunc(reps, func(r repPoint) bool { return r.ID == c.id })
			}
			if k >= 0 {
				rs.Completed[i], rs.HitPred[i], rs.HitActual[i] = reps[k].Completed, reps[k].HitPred, reps[k].HitActual
			}
		}
		out.Replicas = append(out.Replicas, rs)
	}
	return out
}

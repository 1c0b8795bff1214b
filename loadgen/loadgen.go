// Package loadgen replays a workload against any OpenAI-compatible
// endpoint (kvrouter, a vLLM or SGLang replica, an emulated replica) and
// measures what a client sees: time to first token, inter-token latency and
// end-to-end latency from the SSE stream, and the prompt and cached tokens
// the engine reports in its usage chunk.
//
// Prompts are real text synthesised from the workload's segments
// (trace.AppendSegmentText), so the engine's prefix cache sees the
// workload's true reuse. A turn of a session waits for the session's
// previous turn to finish, as a chat client does, then goes out at its
// arrival time or at once if that has passed.
//
// It runs open loop (each request at its arrival time, optionally rescaled
// to a rate) or closed loop (a fixed number of clients sending back to
// back), bounded by a request count and a wall-clock duration.
package loadgen

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/trace"
)

// Defaults of Config.
const (
	// DefaultDuration bounds a run's wall time.
	DefaultDuration = 5 * time.Minute
	// DefaultRequestTimeout bounds one request's wall time.
	DefaultRequestTimeout = 2 * time.Minute
	// DefaultSessionHeader carries a request's session id.
	DefaultSessionHeader = "X-Session-ID"
	// HeaderReplica is the response header in which kvrouter names the
	// replica that served a request.
	HeaderReplica = "X-Kvrouter-Replica"
)

// Config configures one replay run.
type Config struct {
	// Target is the endpoint's base URL, e.g. "http://127.0.0.1:8000";
	// requests go to Target+"/v1/chat/completions".
	Target string
	// Model is the model name sent with every request; empty means the
	// first model the endpoint lists at /v1/models.
	Model string
	// Requests is the workload, in arrival order.
	Requests []trace.Request
	// MaxRequests keeps only the first MaxRequests requests; zero means all.
	MaxRequests int
	// Rate, if positive, rescales arrival times so the mean arrival rate is
	// Rate requests per wall second (open loop).
	Rate float64
	// Concurrency, if positive, runs closed loop instead: Concurrency
	// clients each send the next request as soon as their previous one is
	// done, ignoring arrival times.
	Concurrency int
	// Duration bounds the run's wall time: no request starts after it and
	// requests still running are cut (Sample.Err "cut"). Zero means
	// DefaultDuration.
	Duration time.Duration
	// TimeScale is wall seconds per model second, as emulator.Config's:
	// arrival times are multiplied by it, and measured latencies divided
	// by it so that samples are in model time. Zero means 1 (a real
	// engine).
	TimeScale float64
	// RequestTimeout bounds one request's wall time (Sample.Err
	// "timeout"); zero means DefaultRequestTimeout.
	RequestTimeout time.Duration
	// SessionHeader carries Request.Session; empty means
	// DefaultSessionHeader.
	SessionHeader string
	// IDHeader, if not empty, carries Request.ID on every request (the
	// demo matches the engines' own timings to its samples by it).
	IDHeader string
	// Parallel, if not nil, says which requests go out at their arrival
	// time without waiting for their session's previous request (an
	// agent's parallel calls in one session); nil means every turn of a
	// session waits.
	Parallel func(q *trace.Request) bool
	// SystemSegments is how many leading segments of a session's prompt
	// form its system message (the rest alternate user, assistant, user,
	// ...); zero means 1 for requests with a session. Requests without a
	// session send their whole prompt as one user message.
	SystemSegments int
	// MaxTokens caps each request's output tokens; zero means the
	// workload's own Output.
	MaxTokens int
	// IgnoreEOS sends "ignore_eos": true (vLLM, SGLang), so that every
	// request generates exactly its max_tokens.
	IgnoreEOS bool
	// Client sends the requests; nil means a client with a transport sized
	// for many concurrent streams.
	Client *http.Client
	// OnDone, if set, is called after each request with its sample, from
	// the request's goroutine (progress bars).
	OnDone func(Sample)
}

// Result is what a run measured.
type Result struct {
	// Samples holds one entry per request sent, in workload order.
	Samples []Sample
	// Skipped counts the requests never sent because the run's duration or
	// context ended first.
	Skipped int
	// Wall is the run's wall time.
	Wall time.Duration
	// TimeScale is the Config's (1 when zero), for converting back.
	TimeScale float64
}

// Run replays cfg.Requests against cfg.Target until they are all done, the
// duration is up, or ctx ends. Errors of single requests are recorded in
// their samples; Run fails only on a bad Config or an unreachable model
// list.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	r, err := newRunner(ctx, cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Duration)
	defer cancel()
	start := time.Now()
	r.start = start
	if r.cfg.Concurrency > 0 {
		r.closedLoop(ctx)
	} else {
		r.openLoop(ctx)
	}
	res := &Result{Wall: time.Since(start), TimeScale: r.cfg.TimeScale}
	for i := range r.samples {
		if !r.sent[i] {
			res.Skipped++
			continue
		}
		res.Samples = append(res.Samples, r.samples[i])
	}
	return res, nil
}

// runner is one run's state.
type runner struct {
	cfg     Config
	reqs    []trace.Request
	at      []time.Duration // wall send times from the run's start
	start   time.Time
	samples []Sample        // by request index; written once by the request's goroutine
	sent    []bool          // by request index; read after every goroutine is joined
	prev    []chan struct{} // by request index: the session's previous request's done, or nil
	done    []chan struct{} // by request index: closed when the request is over
	wg      sync.WaitGroup
}

func newRunner(ctx context.Context, cfg Config) (*runner, error) {
	if cfg.Target == "" {
		return nil, errors.New("loadgen: no target")
	}
	if cfg.TimeScale < 0 || cfg.Rate < 0 || cfg.Concurrency < 0 || cfg.MaxRequests < 0 {
		return nil, errors.New("loadgen: negative time scale, rate, concurrency or request count")
	}
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 1
	}
	if cfg.Duration <= 0 {
		cfg.Duration = DefaultDuration
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.SessionHeader == "" {
		cfg.SessionHeader = DefaultSessionHeader
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Transport: &http.Transport{
			MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, DisableCompression: true,
		}}
	}
	reqs := cfg.Requests
	if cfg.MaxRequests > 0 && cfg.MaxRequests < len(reqs) {
		reqs = reqs[:cfg.MaxRequests]
	}
	if cfg.Model == "" {
		m, err := FirstModel(ctx, cfg.Client, cfg.Target)
		if err != nil {
			return nil, fmt.Errorf("loadgen: %w", err)
		}
		cfg.Model = m
	}
	r := &runner{cfg: cfg, reqs: reqs, samples: make([]Sample, len(reqs)), sent: make([]bool, len(reqs))}
	r.at = arrivals(reqs, cfg.Rate, cfg.TimeScale)
	r.prev, r.done = sessionOrder(reqs, cfg.Parallel)
	return r, nil
}

// arrivals returns the wall send times: arrival times relative to the
// first, rescaled to rate requests/s if rate > 0, else multiplied by scale.
func arrivals(reqs []trace.Request, rate, scale float64) []time.Duration {
	out := make([]time.Duration, len(reqs))
	if len(reqs) == 0 {
		return out
	}
	t0 := reqs[0].At
	span := reqs[len(reqs)-1].At - t0
	f := scale
	if rate > 0 && span > 0 && len(reqs) > 1 {
		f = float64(len(reqs)-1) / rate / span.Seconds()
	}
	for i, q := range reqs {
		out[i] = time.Duration(float64(q.At-t0) * f)
		if rate > 0 && span == 0 {
			out[i] = time.Duration(float64(i) / rate * float64(time.Second))
		}
	}
	return out
}

// sessionOrder returns, per request, a done channel to be closed when it
// is over, and the done channel of the same session's previous request
// (nil for a first turn, a request without a session, or one parallel
// says goes out on its own; nor does a later turn wait for that one).
func sessionOrder(reqs []trace.Request, parallel func(*trace.Request) bool) (prev, done []chan struct{}) {
	prev = make([]chan struct{}, len(reqs))
	done = make([]chan struct{}, len(reqs))
	last := map[string]int{}
	for i := range reqs {
		done[i] = make(chan struct{})
		s := reqs[i].Session
		if s == "" || parallel != nil && parallel(&reqs[i]) {
			continue
		}
		if j, ok := last[s]; ok {
			prev[i] = done[j]
		}
		last[s] = i
	}
	return prev, done
}

// openLoop sends each request at its arrival time.
func (r *runner) openLoop(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for i := range r.reqs {
		if d := time.Until(r.start.Add(r.at[i])); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				r.abandon(i)
				r.wg.Wait()
				return
			}
		}
		r.wg.Go(func() { r.one(ctx, i) })
	}
	r.wg.Wait()
}

// abandon closes the done channels of requests from i on, so that nothing
// waits for them.
func (r *runner) abandon(from int) {
	for i := from; i < len(r.reqs); i++ {
		close(r.done[i])
	}
}

// closedLoop runs Concurrency clients over the requests in order.
func (r *runner) closedLoop(ctx context.Context) {
	next := make(chan int)
	for range r.cfg.Concurrency {
		r.wg.Go(func() {
			for i := range next {
				r.one(ctx, i)
			}
		})
	}
	for i := range r.reqs {
		select {
		case next <- i:
			continue
		case <-ctx.Done():
			r.abandon(i)
		}
		break
	}
	close(next)
	r.wg.Wait()
}

// one waits for request i's session predecessor, then sends it.
func (r *runner) one(ctx context.Context, i int) {
	defer close(r.done[i])
	if prev := r.prev[i]; prev != nil {
		select {
		case <-prev:
		case <-ctx.Done():
			return
		}
	}
	if ctx.Err() != nil {
		return
	}
	r.sent[i] = true
	s := r.send(ctx, &r.reqs[i])
	r.samples[i] = s
	if r.cfg.OnDone != nil {
		r.cfg.OnDone(s)
	}
}

package demo

import (
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/loadgen"
	"github.com/kvrouter/kvrouter/report"
)

// idHeader carries each request's workload id from the client through the
// router to the replica, where engineTimes files the engine's timing
// under it.
const idHeader = "X-Kvrouter-Demo-Request"

// engineTime is one request's timing on its engine's clock (model time):
// from its arrival at the engine to its first and its last token.
type engineTime struct {
	TTFT, E2E time.Duration
	Output    int
	// Arrived is when the request reached its engine, on that engine's
	// clock.
	Arrived time.Duration
}

// engineTimes collects the engines' own timings of a policy's requests
// (emulator.Config.OnDone), by request id. Model time does not stretch
// when the host is busy: an engine that wakes late runs the iterations
// it owed at the times they were due.
type engineTimes struct {
	mu   sync.Mutex // guards byID
	byID map[string]engineTime
}

func newEngineTimes() *engineTimes { return &engineTimes{byID: map[string]engineTime{}} }

// record files a finished request's engine timing; an emulator.Config
// OnDone hook.
func (e *engineTimes) record(r *http.Request, ev engine.Event) {
	id := r.Header.Get(idHeader)
	if id == "" {
		return
	}
	t := engineTime{TTFT: ev.First - ev.Arrived, E2E: ev.At - ev.Arrived, Output: ev.OutputTokens, Arrived: ev.Arrived}
	e.mu.Lock()
	e.byID[id] = t
	e.mu.Unlock()
}

// samples returns load's samples for package report with their latencies
// replaced by the engines' own (model time), and how many had none (a
// failed request keeps what the client measured).
func (e *engineTimes) samples(load *loadgen.Result, replicas []string) ([]report.Sample, int) {
	out := load.ReportSamples(replicas)
	e.mu.Lock()
	defer e.mu.Unlock()
	missing := 0
	for i := range out {
		t, ok := e.byID[load.Samples[i].ID]
		if !ok {
			if out[i].OK {
				missing++
			}
			continue
		}
		out[i].TTFT, out[i].E2E, out[i].ITL = t.TTFT, t.E2E, 0
		if t.Output > 1 {
			out[i].ITL = (t.E2E - t.TTFT) / time.Duration(t.Output-1)
		}
	}
	return out, missing
}

// lag returns, over load's completed requests with an engine timing,
// the median and 90th percentile of how long (model time) a request took
// from the client's send to its engine: the router's and the host's
// part, which the engines' latencies leave out. Each replica's clock
// starts at its own zero, so a replica's lags are taken from its
// quickest request's.
func (e *engineTimes) lag(load *loadgen.Result) (p50, p90 time.Duration) {
	scale := load.TimeScale
	if scale <= 0 {
		scale = 1
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	by := map[string][]time.Duration{}
	for i := range load.Samples {
		s := &load.Samples[i]
		if t, ok := e.byID[s.ID]; ok && s.OK() {
			by[s.Replica] = append(by[s.Replica], t.Arrived-time.Duration(float64(s.Sent)/scale))
		}
	}
	var all []time.Duration
	for _, ds := range by {
		base := slices.Min(ds)
		for _, d := range ds {
			all = append(all, d-base)
		}
	}
	if len(all) == 0 {
		return 0, 0
	}
	slices.Sort(all)
	return all[len(all)/2], all[min(len(all)*9/10, len(all)-1)]
}

// probeEvery is how often the host probe asks to wake up.
const probeEvery = 5 * time.Millisecond

// HostLag is how late the host woke a sleeping goroutine during the run,
// in wall time: what a busy machine does to every timer of the in-process
// replicas, router and client. The demo's latencies are on the engines'
// clocks and do not include it; the client's wall-clock figures do.
type HostLag struct {
	// P50, P99 and Max are percentiles of the lateness of wake-ups asked
	// for every 5 ms.
	P50, P99, Max time.Duration
	// Samples counts the wake-ups measured.
	Samples int
}

// Busy reports whether the host was busy enough to show: wake-ups late by
// more than 5 ms at the 99th percentile.
func (h HostLag) Busy() bool { return h.P99 > probeEvery }

// hostProbe measures HostLag until stopped.
type hostProbe struct {
	stop chan struct{}
	done chan HostLag
}

// startProbe starts measuring how late the host wakes a sleeping
// goroutine.
func startProbe() *hostProbe {
	p := &hostProbe{stop: make(chan struct{}), done: make(chan HostLag, 1)}
	go p.run()
	return p
}

func (p *hostProbe) run() {
	var late []time.Duration
	t := time.NewTimer(probeEvery)
	defer t.Stop()
	want := time.Now().Add(probeEvery)
	for {
		select {
		case <-p.stop:
			p.done <- lagOf(late)
			return
		case <-t.C:
			// Measured when this goroutine runs, not when the timer
			// fired: a busy host delays the former.
			now := time.Now()
			late = append(late, max(now.Sub(want), 0))
			want = now.Add(probeEvery)
			t.Reset(probeEvery)
		}
	}
}

// Stop ends the probe and returns what it measured.
func (p *hostProbe) Stop() HostLag {
	close(p.stop)
	return <-p.done
}

// lagOf summarises wake-up latenesses.
func lagOf(late []time.Duration) HostLag {
	if len(late) == 0 {
		return HostLag{}
	}
	slices.Sort(late)
	at := func(q float64) time.Duration { return late[min(int(q*float64(len(late))), len(late)-1)] }
	return HostLag{P50: at(0.5), P99: at(0.99), Max: late[len(late)-1], Samples: len(late)}
}

package demo

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/loadgen"
)

// TestEngineTimes: the report's samples take each request's latencies
// from its engine's timing (first token and end from its arrival at the
// engine), a completed request without one keeps the client's and is
// counted, and the lag from the client to the engine is measured from
// each replica's quickest request.
func TestEngineTimes(t *testing.T) {
	e := newEngineTimes()
	rec := func(id string, arrived, first, end time.Duration) {
		r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
		r.Header.Set(idHeader, id)
		e.record(r, engine.Event{Kind: engine.Done, Arrived: arrived, First: first, At: end, OutputTokens: 5})
	}
	// Replica a's clock is 10 s ahead of the client's; b's 20 s.
	rec("r1", 11*time.Second, 11*time.Second+40*time.Millisecond, 11*time.Second+240*time.Millisecond)
	rec("r2", 12*time.Second+300*time.Millisecond, 12*time.Second+400*time.Millisecond, 13*time.Second)
	rec("r3", 21*time.Second, 21*time.Second+50*time.Millisecond, 21*time.Second+100*time.Millisecond)
	load := &loadgen.Result{TimeScale: 0.1, Samples: []loadgen.Sample{
		{ID: "r1", Replica: "a", Sent: 100 * time.Millisecond, TTFT: time.Second, E2E: 2 * time.Second},
		{ID: "r2", Replica: "a", Sent: 200 * time.Millisecond, TTFT: time.Second, E2E: 2 * time.Second},
		{ID: "r3", Replica: "b", Sent: 100 * time.Millisecond, TTFT: time.Second, E2E: 2 * time.Second},
		{ID: "r4", Replica: "b", Sent: 300 * time.Millisecond, TTFT: 3 * time.Second, E2E: 4 * time.Second},
	}}
	got, untimed := e.samples(load, []string{"a", "b"})
	want := []struct{ ttft, e2e, itl time.Duration }{
		{40 * time.Millisecond, 240 * time.Millisecond, 50 * time.Millisecond},
		{100 * time.Millisecond, 700 * time.Millisecond, 150 * time.Millisecond},
		{50 * time.Millisecond, 100 * time.Millisecond, 12500 * time.Microsecond},
		{3 * time.Second, 4 * time.Second, 0}, // no engine timing: the client's
	}
	for i, w := range want {
		if got[i].TTFT != w.ttft || got[i].E2E != w.e2e || i < 3 && got[i].ITL != w.itl {
			t.Errorf("sample %d: ttft %v e2e %v itl %v, want %v %v %v", i, got[i].TTFT, got[i].E2E, got[i].ITL, w.ttft, w.e2e, w.itl)
		}
	}
	if untimed != 1 {
		t.Errorf("untimed %d, want 1", untimed)
	}
	// Lags from the client's send (Sent / 0.1) to the engine, less each
	// replica's quickest: a: 0 and 300 ms; b: 0.
	p50, p90 := e.lag(load)
	if p50 != 0 || p90 != 300*time.Millisecond {
		t.Errorf("lag p50 %v p90 %v, want 0 and 300ms", p50, p90)
	}
}

// TestLagOf: the host lag's percentiles, and when it counts as busy.
func TestLagOf(t *testing.T) {
	var late []time.Duration
	for i := range 100 {
		late = append(late, time.Duration(i)*100*time.Microsecond)
	}
	h := lagOf(late)
	if h.P50 != 5*time.Millisecond || h.P99 != 9900*time.Microsecond || h.Max != 9900*time.Microsecond || h.Samples != 100 {
		t.Errorf("got %+v, want p50 5ms, p99 and max 9.9ms, 100 samples", h)
	}
	if !h.Busy() {
		t.Errorf("p99 %v: want busy (over %v)", h.P99, probeEvery)
	}
	if (HostLag{P99: time.Millisecond}).Busy() {
		t.Errorf("p99 1ms: want quiet")
	}
	if lagOf(nil) != (HostLag{}) {
		t.Errorf("no samples: want the zero HostLag")
	}
}

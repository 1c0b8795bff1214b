package sim

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/trace"
)

// TestAdmissionInSimulator: on two replicas offered four times what they
// serve, the simulator runs the live router's admission control. Without
// it every request is routed at once and completes late; with a 200 ms
// limit, a queue of 8 and a 1 s timeout, the requests it cannot hold are
// rejected, reported as rejections (never as fast completions: SLOMet
// counts them as misses), and every request is accounted for once.
func TestAdmissionInSimulator(t *testing.T) {
	preset, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	w, err := trace.Generate("unique", trace.GenOptions{Seed: 1, Requests: 400})
	if err != nil {
		t.Fatal(err)
	}
	run := func(adm fleet.Admission) *report.Result {
		r, err := Run(Config{Workload: "unique", Requests: w.Requests, Replicas: 2, Load: 4, Preset: preset,
			Policies: []string{"least-loaded"}, Admission: adm})
		if err != nil {
			t.Fatal(err)
		}
		return resultOf(t, &r, "least-loaded")
	}
	off := run(fleet.Admission{})
	on := run(fleet.Admission{MaxWait: 200 * time.Millisecond, MaxQueue: 8, QueueTimeout: time.Second})
	t.Logf("off: %d completed, %d rejected, ttft p99 %v; on: %d completed, %d rejected, ttft p99 %v",
		off.Completed, off.Rejected, time.Duration(off.TTFT.P99), on.Completed, on.Rejected, time.Duration(on.TTFT.P99))
	if off.Rejected != 0 || off.Completed != 400 {
		t.Errorf("admission off: %d completed, %d rejected; want 400, 0", off.Completed, off.Rejected)
	}
	if on.Rejected == 0 || on.Completed+on.Rejected+on.Errors != 400 {
		t.Errorf("admission on: %d completed, %d rejected, %d errors; want rejections, 400 in all", on.Completed, on.Rejected, on.Errors)
	}
	if max := float64(on.Completed) / 400; on.SLOMet > max {
		t.Errorf("SLO met by %.3f of requests, more than the %.3f that completed", on.SLOMet, max)
	}
}

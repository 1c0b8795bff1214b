package sim

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/route"
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

// TestSLOAdmissionInSimulator: the simulator applies --slo-admission
// through the fleet as the live router does. On interactive-batch, kv-aware
// on four replicas at four times the knee (where it predicts misses; at
// twice, it predicts none): route rejects and queues nothing;
// reject rejects requests, each for "slo-unattainable", counted by class;
// queue holds requests and rejects only those whose TTFT bound passed in
// the queue. A repeat of each run gives exactly the same counts.
func TestSLOAdmissionInSimulator(t *testing.T) {
	preset, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	w, err := trace.Generate("interactive-batch", trace.GenOptions{Seed: 1, Requests: n})
	if err != nil {
		t.Fatal(err)
	}
	run := func(mode string) *report.Result {
		adm := fleet.Admission{MaxWait: fleet.DefaultMaxWait, MaxQueue: fleet.DefaultMaxQueue, QueueTimeout: fleet.DefaultQueueTimeout, SLO: mode}
		r, err := Run(Config{Workload: "interactive-batch", Requests: w.Requests, Replicas: 4, Load: 4, Preset: preset,
			Policies: []string{"kv-aware"}, Admission: adm})
		if err != nil {
			t.Fatal(err)
		}
		return resultOf(t, &r, "kv-aware")
	}
	for _, mode := range []string{fleet.SLORoute, fleet.SLOReject, fleet.SLOQueue} {
		res := run(mode)
		byClass := report.ClassResult{}
		for _, c := range res.Classes {
			byClass.Rejected += c.Rejected
			byClass.SLOQueued += c.SLOQueued
		}
		t.Logf("%s: %d completed, %d rejected, %d queued for their SLO, SLO met %.3f, classes %+v",
			mode, res.Completed, res.Rejected, res.SLOQueued, res.SLOMet, res.Classes)
		if res.Completed+res.Rejected+res.Errors != n {
			t.Errorf("%s: %d completed, %d rejected, %d errors; want %d in all", mode, res.Completed, res.Rejected, res.Errors, n)
		}
		if byClass.Rejected != res.Rejected || byClass.SLOQueued != res.SLOQueued {
			t.Errorf("%s: classes count %d rejected, %d queued; the run %d, %d", mode, byClass.Rejected, byClass.SLOQueued, res.Rejected, res.SLOQueued)
		}
		if got := res.Reasons[route.ReasonUnattainable]; got != res.Rejected {
			t.Errorf("%s: %d rejected for %q of %d rejected", mode, got, route.ReasonUnattainable, res.Rejected)
		}
		switch mode {
		case fleet.SLORoute:
			if res.Rejected != 0 || res.SLOQueued != 0 {
				t.Errorf("route: %d rejected, %d queued; want none", res.Rejected, res.SLOQueued)
			}
			continue
		case fleet.SLOReject:
			if res.Rejected == 0 || res.SLOQueued != 0 {
				t.Errorf("reject: %d rejected, %d queued; want rejections, none queued", res.Rejected, res.SLOQueued)
			}
		case fleet.SLOQueue:
			if res.SLOQueued == 0 || res.Rejected > res.SLOQueued {
				t.Errorf("queue: %d queued, %d rejected; want some queued, rejections only among them", res.SLOQueued, res.Rejected)
			}
		}
		again := run(mode)
		if again.Rejected != res.Rejected || again.SLOQueued != res.SLOQueued || again.Completed != res.Completed {
			t.Errorf("%s repeated: %d rejected, %d queued, %d completed; first %d, %d, %d",
				mode, again.Rejected, again.SLOQueued, again.Completed, res.Rejected, res.SLOQueued, res.Completed)
		}
	}
}

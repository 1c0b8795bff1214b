package sim

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/trace"
)

// TestSLOClasses: on interactive-batch, each request reaches the fleet's
// decision with its class's SLO, derived from the class's own requests
// (the interactive class's TTFT tighter than the batch class's), a bound
// the trace gives kept; a request without a class carries the run's SLO;
// and the report's attainment per class counts each class's requests
// against its own bounds.
func TestSLOClasses(t *testing.T) {
	preset, err := engine.Preset(engine.DefaultPreset)
	if err != nil {
		t.Fatal(err)
	}
	w, err := trace.Generate("interactive-batch", trace.GenOptions{Seed: 2, Requests: 200})
	if err != nil {
		t.Fatal(err)
	}
	reqs := w.Requests
	reqs[0].SLO = route.SLO{}                                                            // no class: the run's
	reqs[1].SLO = route.SLO{Class: trace.ClassInteractive, TTFT: 123 * time.Millisecond} // its own TTFT kept
	jobs := makeJobs(reqs, preset.BlockSize, 1, 1)
	want := map[string]SLO{}
	for _, cl := range []string{trace.ClassInteractive, trace.ClassBatch} {
		var js []job
		for i := range jobs {
			if jobs[i].slo.Class == cl {
				js = append(js, jobs[i])
			}
		}
		want[cl] = SLO{}.derive(js, &preset)
	}
	if want[trace.ClassInteractive].TTFT >= want[trace.ClassBatch].TTFT {
		t.Errorf("interactive TTFT %v, batch %v: want the interactive class's tighter", want[trace.ClassInteractive].TTFT, want[trace.ClassBatch].TTFT)
	}
	run := SLO{TTFT: 700 * time.Millisecond, ITL: 45 * time.Millisecond}
	got := map[string]route.SLO{}
	o, err := simulate(Config{Requests: reqs, Replicas: 2, Load: 0.9, Preset: preset, Policies: []string{"kv-aware"}, SLO: run,
		Trace: func(_ string, s Step) {
			if s.Kind == StepArrival {
				got[s.ReqID] = s.Request.SLO
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		r := &reqs[i]
		w := route.SLO{TTFT: run.TTFT, ITL: run.ITL}
		if cl := r.SLO.Class; cl != "" {
			w = route.SLO{Class: cl, TTFT: want[cl].TTFT, ITL: want[cl].ITL}
		}
		if i == 1 {
			w.TTFT = 123 * time.Millisecond
		}
		if got[r.ID] != w {
			t.Errorf("%s: the fleet was given SLO %+v, want %+v", r.ID, got[r.ID], w)
		}
	}
	classes := report.Summarize(o.runs[0].samples, report.Options{SLO: report.SLO(run)}).Classes
	if len(classes) != 2 {
		t.Fatalf("%d classes reported, want 2: %+v", len(classes), classes)
	}
	idAt := map[time.Duration]string{} // the run's arrivals, scaled to its load
	for _, j := range o.jobs {
		idAt[j.at] = j.id
	}
	for _, c := range classes {
		n, met := 0, 0
		for _, s := range o.runs[0].samples {
			if s.Class != c.Class {
				continue
			}
			n++
			b := got[idAt[s.At]]
			if s.OK && s.TTFT <= b.TTFT && s.ITL <= b.ITL {
				met++
			}
		}
		if c.Requests != n || c.SLOMet != float64(met)/float64(n) {
			t.Errorf("class %s: %d requests, %.4f met; want %d, %d/%d", c.Class, c.Requests, c.SLOMet, n, met, n)
		}
	}
}

// TestCapacityOfAClass: a capacity search for one SLO class counts only
// that class's requests, each against its own bounds: the attainment it
// reports at a load is the share of the class's requests of a run at
// that load meeting them; a class no request has is an error.
func TestCapacityOfAClass(t *testing.T) {
	preset, err := engine.Preset(engine.DefaultPreset)
	if err != nil {
		t.Fatal(err)
	}
	w, err := trace.Generate("interactive-batch", trace.GenOptions{Seed: 3, Requests: 160})
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Workload: w.Name, Requests: w.Requests, Replicas: 2, Preset: preset, Policies: []string{"least-loaded"}}
	c, err := Capacity(cfg, CapacitySearch{Class: trace.ClassInteractive, Tolerance: 0.2, MaxLoad: 8})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Load = 1
	o, err := prepare(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := o.classSLO(trace.ClassInteractive)
	if c.SLO != want {
		t.Errorf("search SLO %+v, want the interactive class's %+v", c.SLO, want)
	}
	a := c.Policies[0].Curve[0]
	res, err := o.scaled(a.Load).run("least-loaded")
	if err != nil {
		t.Fatal(err)
	}
	n, met := 0, 0
	for _, s := range res.samples {
		if s.Class == trace.ClassInteractive {
			n++
			if s.OK && s.TTFT <= want.TTFT && s.ITL <= want.ITL {
				met++
			}
		}
	}
	if n == 0 || a.Met != float64(met)/float64(n) {
		t.Errorf("attainment at load %g: %g, want %d of %d interactive requests", a.Load, a.Met, met, n)
	}
	if _, err := Capacity(cfg, CapacitySearch{Class: "nightly"}); err == nil {
		t.Error("a class no request has: no error")
	}
}

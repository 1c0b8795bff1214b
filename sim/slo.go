package sim

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/report"
)

// sloFactor is the slack of the derived goodput SLO: a request meets it
// when it takes at most this many times what the workload's median prompt
// takes alone on an idle replica.
const sloFactor = 5

// derive fills the zero fields of s from the preset c and the jobs, so that
// the SLO sits where the policies differ (a fixed 2 s is met by nearly
// every request of a short-prompt workload and by few of a long one):
//
//	TTFT = the uncached prefill of the 99th-percentile prompt P99 on an
//	       idle replica (idlePrefill: engine/step.go's iteration time
//	       summed over the prompt's chunks), plus the median prompt P's
//	       slack, (5 − 1) × its own
//	ITL  = 5 × one decode iteration of a batch of one at context P
//	       (decodeIteration)
//
// over the prompts of the jobs the engine serves. Where prompts are
// alike, TTFT is 5 × P's idle prefill. Where they spread (a trace of
// long and short contexts), a bound of five medians is one the longest
// prompts miss on an idle fleet; so a capacity at the 99% point would
// be zero whatever the routing. Every prompt up to the 99th percentile
// gets the median's allowance for queueing instead.
func (s SLO) derive(jobs []job, c *engine.Config) SLO {
	p, p99 := promptQuantile(jobs, c, 0.5), promptQuantile(jobs, c, 0.99)
	if s.TTFT == 0 {
		s.TTFT = (idlePrefill(c, p99) + (sloFactor-1)*idlePrefill(c, p)).Round(100 * time.Microsecond)
	}
	if s.ITL == 0 {
		s.ITL = (sloFactor * decodeIteration(c, p)).Round(100 * time.Microsecond)
	}
	return s
}

// promptQuantile is the q-quantile (nearest rank: the ⌈q·n⌉-th of n) of the prompt
// lengths of the jobs an engine of configuration c serves (of all jobs
// if it serves none; 1 without jobs).
func promptQuantile(jobs []job, c *engine.Config, q float64) int {
	var ps []int
	for i := range jobs {
		if servable(c, &jobs[i]) {
			ps = append(ps, jobs[i].prompt)
		}
	}
	if len(ps) == 0 {
		for i := range jobs {
			ps = append(ps, jobs[i].prompt)
		}
	}
	if len(ps) == 0 {
		return 1
	}
	slices.Sort(ps)
	return max(ps[max(int(math.Ceil(q*float64(len(ps))))-1, 0)], 1)
}

// decodeIteration is the length of an iteration that decodes one sequence
// of context tokens and nothing else, by the engine's timing model
// (engine/step.go, duration).
func decodeIteration(c *engine.Config, context int) time.Duration {
	return c.StepOverhead + c.DecodeStep + c.DecodePerSeq +
		time.Duration(int64(context)*int64(c.DecodePerMTokens)/1_000_000)
}

// idlePrefill is the time a prompt of p tokens takes to prefill alone on
// an idle replica: its compute, and the step overhead of each chunk of
// MaxBatchedTokens it is cut into (engine/step.go, duration).
func idlePrefill(c *engine.Config, p int) time.Duration {
	chunks := (p + c.MaxBatchedTokens - 1) / c.MaxBatchedTokens
	return time.Duration(prefillCompute(c, float64(p))) + time.Duration(chunks)*c.StepOverhead
}

// classSLOs fills the zero bounds of the jobs that carry an SLO class
// (trace.Request.SLO) with their class's derived SLO: derive over the
// class's own jobs, so that a class of short prompts gets a tight TTFT
// and one of long prompts a loose one, by the same rule as the run's.
func classSLOs(jobs []job, c *engine.Config) {
	byClass := map[string][]job{}
	for i := range jobs {
		if cl := jobs[i].slo.Class; cl != "" {
			byClass[cl] = append(byClass[cl], jobs[i])
		}
	}
	derived := map[string]SLO{}
	for cl, js := range byClass {
		derived[cl] = SLO{}.derive(js, c)
	}
	for i := range jobs {
		s := &jobs[i].slo
		if s.Class == "" {
			continue
		}
		d := derived[s.Class]
		s.TTFT, s.ITL = cmp.Or(s.TTFT, d.TTFT), cmp.Or(s.ITL, d.ITL)
	}
}

// classOf is job jb's SLO class and bounds as a sample reports them;
// empty and zero for a job held to the run's SLO.
func classOf(jb *job) (string, report.SLO) {
	if jb.slo.Class == "" {
		return "", report.SLO{}
	}
	return jb.slo.Class, report.SLO{TTFT: jb.slo.TTFT, ITL: jb.slo.ITL}
}

// classSLO is the bounds of the first job of class, and whether there is
// one.
func (o *outcome) classSLO(class string) (report.SLO, bool) {
	for i := range o.jobs {
		if o.jobs[i].slo.Class == class {
			_, s := classOf(&o.jobs[i])
			return s, true
		}
	}
	return report.SLO{}, false
}

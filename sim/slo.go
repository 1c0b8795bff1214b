package sim

import (
	"slices"
	"time"

	"github.com/kvrouter/kvrouter/engine"
)

// sloFactor is the slack of the derived goodput SLO: a request meets it
// when it takes at most this many times what the workload's median prompt
// takes alone on an idle replica.
const sloFactor = 5

// derive fills the zero fields of s from the preset c and the jobs, so that
// the SLO sits where the policies differ (a fixed 2 s is met by nearly
// every request of a short-prompt workload and by few of a long one):
//
//	TTFT = 5 × the uncached prefill of the median prompt on an idle
//	       replica: work(c, P, 0), which is engine/step.go's iteration
//	       time summed over the prompt's chunks
//	ITL  = 5 × one decode iteration of a batch of one at context P
//	       (decodeIteration)
//
// for P the median prompt of the jobs the engine serves.
func (s SLO) derive(jobs []job, c *engine.Config) SLO {
	p := medianPrompt(jobs, c)
	if s.TTFT == 0 {
		s.TTFT = (sloFactor * work(c, p, 0)).Round(100 * time.Microsecond)
	}
	if s.ITL == 0 {
		s.ITL = (sloFactor * decodeIteration(c, p)).Round(100 * time.Microsecond)
	}
	return s
}

// medianPrompt is the lower median prompt length of the jobs an engine of
// configuration c serves (of all jobs if it serves none; 1 without jobs).
func medianPrompt(jobs []job, c *engine.Config) int {
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
	return max(ps[(len(ps)-1)/2], 1)
}

// decodeIteration is the length of an iteration that decodes one sequence
// of context tokens and nothing else, by the engine's timing model
// (engine/step.go, duration).
func decodeIteration(c *engine.Config, context int) time.Duration {
	return c.StepOverhead + c.DecodeStep + c.DecodePerSeq +
		time.Duration(int64(context)*int64(c.DecodePerMTokens)/1_000_000)
}

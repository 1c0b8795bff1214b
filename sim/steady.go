package sim

import (
	"math"
	"time"

	"github.com/kvrouter/kvrouter/report"
)

// steadyTurnovers is how many times the requests in the fleet must be
// replaced over a run for its attainment to be the steady state's.
//
// A run starts on an empty fleet: the requests arriving during the first
// turnover (the time one request spends in the system, W) find queues
// shorter than those of the steady state, and meet the SLO more often.
// They are a share 1/n of a run of n turnovers, so they raise the share
// missing the SLO by at most 1/n of it: at n = 10 the measured misses are
// within 10% of the steady state's (0.1 points at the 99% point), below
// the gap between adjacent loads of the search's grid.
const steadyTurnovers = 10

// steadyRequests is the run length the steady state needs at load: by
// Little's law a fleet receiving λ = load × knee requests per second
// holds λW of them, and n turnovers take n·λ·W requests. W is bounded by
// the SLO itself for the requests that meet it (as nearly all do at a
// capacity): TTFT + (mean output − 1) × ITL.
func (o *outcome) steadyRequests(load float64) int {
	if len(o.jobs) == 0 || o.knee <= 0 {
		return 0
	}
	out := 0
	for i := range o.jobs {
		out += o.jobs[i].output
	}
	mean := float64(out) / float64(len(o.jobs))
	w := o.cfg.SLO.TTFT + time.Duration((mean-1)*float64(o.cfg.SLO.ITL))
	return int(math.Ceil(steadyTurnovers * load * o.knee * w.Seconds()))
}

// steady sets c's run length and the length a steady state needs at the
// highest load that decided a capacity: the first load above the highest
// capacity found (the search's grid step above it), or the highest
// capacity itself when it was capped.
func (o *outcome) steady(c *report.Capacity, tol float64) {
	c.Requests = len(o.jobs)
	top := 0.0
	for _, p := range c.Policies {
		for _, l := range p.At {
			next := l.Load * (1 + tol)
			if l.Capped {
				next = l.Load
			}
			top = max(top, next)
		}
	}
	c.SteadyRequests = o.steadyRequests(top)
}

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
// They are a share 1/n of a run of n turnovers, so they lower the share
// missing the SLO by at most 1/n of it: at n = 10 the measured misses are
// within 10% of the steady state's (0.1 points at the 99% point).
const steadyTurnovers = 10

// deciding is the run of a search that decided a capacity at the highest
// load: the first load above a capacity, which failed its level (or the
// capacity itself when it was still met at the ceiling), with W, the
// mean time its requests spent in the fleet (arrival to end; zero for a
// rejection).
type deciding struct {
	load float64
	w    time.Duration
}

// meanE2E is the mean time in the fleet of samples.
func meanE2E(samples []report.Sample) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	var sum time.Duration
	for i := range samples {
		sum += samples[i].E2E
	}
	return sum / time.Duration(len(samples))
}

// steadyRequests is the run length a steady state needs at d: by
// Little's law a fleet receiving λ = load × knee requests per second
// holds λW of them, and n turnovers take n·λ·W requests.
func (o *outcome) steadyRequests(d deciding) int {
	return int(math.Ceil(steadyTurnovers * d.load * o.knee * d.w.Seconds()))
}

// steady sets c's run length and the length a steady state needs at the
// highest load that decided a capacity, of tops, each policy's.
func (o *outcome) steady(c *report.Capacity, tops []deciding) {
	c.Requests = len(o.jobs)
	for _, d := range tops {
		c.SteadyRequests = max(c.SteadyRequests, o.steadyRequests(d))
	}
}

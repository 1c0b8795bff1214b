package sim

import (
	"time"

	"kvrouter/route"
)

// typicalBatch is the decode batch assumed when pricing one output token
// for the capacity estimate: a busy replica decodes about this many
// sequences per step, so one token costs DecodeStep/typicalBatch +
// DecodePerSeq of replica time.
const typicalBatch = 32

// work is the replica time one request costs with nothing cached: its
// prefill (linear term plus the attention term of the preset's timing
// model, route.Rates' formula) plus its output tokens at the typical batch.
//
// This is the capacity model behind Config.Load: a replica supplies one
// second of work per second, so a fleet of R replicas at load L is offered
// L×R seconds of work per second. Caching is deliberately not credited:
// the offered load is the same for every policy, and a policy that reuses
// more runs its fleet below the nominal load.
func work(r *route.Rates, prompt, output int) time.Duration {
	n := float64(prompt)
	prefill := n*float64(r.PrefillPerToken) + n*n/2*float64(r.AttnPerToken2)/1e6
	batch := typicalBatch
	if r.MaxSeqs > 0 && r.MaxSeqs < batch {
		batch = r.MaxSeqs
	}
	decode := float64(output) * (float64(r.DecodeStep)/float64(batch) + float64(r.DecodePerSeq))
	return time.Duration(prefill + decode)
}

// scaleArrivals rewrites the arrival times of jobs (sorted by arrival) so
// that the offered work is load × replicas × the span of the run: every
// arrival time is multiplied by one factor. When all arrivals share one
// instant, they are spaced evenly at the target rate instead. load ≤ 0
// leaves the times alone. It returns the factor applied (0 when spaced).
func scaleArrivals(jobs []job, r *route.Rates, replicas int, load float64) float64 {
	if load <= 0 || len(jobs) == 0 || replicas <= 0 {
		return 1
	}
	var total float64
	for i := range jobs {
		total += float64(work(r, jobs[i].prompt, jobs[i].output))
	}
	// Span the offered work needs at the target load.
	span := total / (load * float64(replicas))
	first, last := jobs[0].at, jobs[len(jobs)-1].at
	if last <= first {
		step := span / float64(len(jobs))
		for i := range jobs {
			jobs[i].at = time.Duration(step * float64(i))
		}
		return 0
	}
	// The trace's span covers n-1 gaps; stretch it to (n-1)/n of span so
	// that the mean rate (n / span) is the target.
	n := float64(len(jobs))
	f := span * (n - 1) / n / float64(last-first)
	for i := range jobs {
		jobs[i].at = time.Duration(float64(jobs[i].at-first) * f)
	}
	return f
}

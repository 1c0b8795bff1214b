package sim

import (
	"time"

	"github.com/kvrouter/kvrouter/engine"
)

// typicalBatch is the decode batch assumed when pricing one output token
// for the capacity estimate: a busy replica decodes about this many
// sequences per step, so the per-step costs (StepOverhead + DecodeStep)
// are shared by that many tokens. Measured, not guessed: on the Mooncake
// trace (16 replicas, least-loaded, nominal load 0.8) the engine model
// produced 5.4 output tokens per iteration, because long prefill chunks
// make iterations long and few; short-prompt workloads batch more. 8 is
// the compromise. (The engines' busy fraction cannot check the estimate:
// the engine model iterates back to back while anything runs, so a lone
// decoding sequence keeps it "busy"; queueing delay, TTFT, is the gauge.)
const typicalBatch = 8

// work is the replica time one request costs with nothing cached, from the
// engine preset's own timing model (engine/step.go's iteration duration,
// split per request):
//
//	prefill = P×PrefillPerToken + P²/2×AttnPerMPairs/1e6
//	          + ⌈P/MaxBatchedTokens⌉×StepOverhead           (chunks)
//	decode  = O×((StepOverhead+DecodeStep)/B + DecodePerSeq
//	          + (P+O/2)×DecodePerMTokens/1e6)                 (KV reads)
//
// for P prompt and O output tokens, B = min(typicalBatch, MaxNumSeqs).
//
// This is the capacity model behind Config.Load: a replica supplies one
// second of work per second, so a fleet of R replicas at load L is offered
// L×R seconds of work per second. Caching is deliberately not credited:
// the offered load is the same for every policy, and a policy that reuses
// more runs its fleet below the nominal load. Mixing prefill chunks and
// decodes in one iteration saves a little (one StepOverhead for both), so
// load 1 is at or just under saturation.
func work(c *engine.Config, prompt, output int) time.Duration {
	p, o := float64(prompt), float64(output)
	chunks := float64((prompt + c.MaxBatchedTokens - 1) / c.MaxBatchedTokens)
	prefill := p*float64(c.PrefillPerToken) + p*p/2*float64(c.AttnPerMPairs)/1e6 + chunks*float64(c.StepOverhead)
	batch := float64(min(typicalBatch, c.MaxNumSeqs))
	perToken := float64(c.StepOverhead+c.DecodeStep)/batch + float64(c.DecodePerSeq) +
		(p+o/2)*float64(c.DecodePerMTokens)/1e6
	return time.Duration(prefill + o*perToken)
}

// scaleArrivals rewrites the arrival times of jobs (sorted by arrival) so
// that the offered work is load × replicas × the span of the run: every
// arrival time is multiplied by one factor. When all arrivals share one
// instant, they are spaced evenly at the target rate instead. load ≤ 0
// leaves the times alone. It returns the factor applied (0 when spaced).
func scaleArrivals(jobs []job, c *engine.Config, replicas int, load float64) float64 {
	if load <= 0 || len(jobs) == 0 || replicas <= 0 {
		return 1
	}
	var total float64
	for i := range jobs {
		total += float64(work(c, jobs[i].prompt, jobs[i].output))
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

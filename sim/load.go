package sim

import (
	"math"
	"time"

	"github.com/kvrouter/kvrouter/engine"
)

// kneeRate is the arrival rate, in requests per second per replica, at
// which a balanced, cache-blind replica reaches the knee of the SLO: the
// rate behind Config.Load 1. It is the engine model's steady state under
// continuous batching (engine/step.go, duration), in the fluid limit:
//
// Every iteration pays the fixed F = StepOverhead + DecodeStep, plus the
// work of the tokens it carries: a request's prefill compute pf (every
// prompt token computed: nothing is cached) and, per output token, its
// sequence's share of the step, d = DecodePerSeq + (P + O/2) ×
// DecodePerMTokens. At λ requests per second the replica does ρ = λ ×
// mean(pf + O×d) seconds of that work per second, so an iteration lasts
//
//	τ(λ) = F / (1 − ρ)
//
// and each decoding sequence waits τ per token: the mean ITL. By
// Little's law the replica then runs B = λ × mean(O) × τ sequences
// holding λ × τ × mean(O × (P + O/2)) tokens of KV. The knee is the
// highest λ at which
//
//   - τ ≤ the SLO's ITL bound,
//   - the 99th-percentile prompt's first token, its prefill compute plus
//     one τ per chunk it takes, is within the SLO's TTFT bound,
//   - B ≤ MaxNumSeqs and the KV fits in NumBlocks,
//
// found by bisection (every constraint grows with λ). Past it a balanced
// fleet misses the SLO on the mean request; a fixed decode batch priced
// per token, as a rule of thumb would, leaves decode-heavy workloads far
// below it at "load 1" (the engine batches up to MaxNumSeqs, not 8).
// Caching is deliberately not credited, so the axis is the same for
// every policy, and a policy that reuses more serves past load 1.
//
// It returns 0 when the constraints cannot all be met at any rate (an
// ITL bound under F, say): the caller then falls back on the work rate
// (ρ = 1).
func kneeRate(jobs []job, c *engine.Config, slo SLO) float64 {
	n := 0
	var work, outputs, held float64 // per request, in ns and tokens
	for i := range jobs {
		j := &jobs[i]
		if !servable(c, j) {
			continue
		}
		p, o := float64(j.prompt), float64(j.output)
		work += prefillCompute(c, p) + o*seqStep(c, p+o/2)
		outputs += o
		held += o * (p + o/2)
		n++
	}
	if n == 0 || work <= 0 {
		return 0
	}
	work, outputs, held = work/float64(n), outputs/float64(n), held/float64(n)
	long := float64(promptQuantile(jobs, c, 0.99))
	chunks := math.Ceil(long / float64(c.MaxBatchedTokens))
	fixed := float64(c.StepOverhead + c.DecodeStep)
	kv := float64(c.NumBlocks * c.BlockSize)
	ok := func(lambda float64) bool { // lambda per ns
		rho := lambda * work
		if rho >= 1 {
			return false
		}
		tau := fixed / (1 - rho)
		return tau <= float64(slo.ITL) &&
			prefillCompute(c, long)+chunks*tau <= float64(slo.TTFT) &&
			lambda*outputs*tau <= float64(c.MaxNumSeqs) &&
			lambda*tau*held <= kv
	}
	hi := 1 / work // ρ = 1
	if !ok(hi * 1e-6) {
		return 0
	}
	lo := hi * 1e-6
	for range 60 {
		mid := (lo + hi) / 2
		if ok(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo * 1e9
}

// workRate is the arrival rate, in requests per second per replica, that
// keeps a cache-blind replica busy all the time (ρ = 1 in kneeRate's
// terms, the fixed cost of iterations left out): the axis when the SLO
// cannot be met at any rate.
func workRate(jobs []job, c *engine.Config) float64 {
	n, work := 0, 0.0
	for i := range jobs {
		j := &jobs[i]
		p, o := float64(j.prompt), float64(j.output)
		work += prefillCompute(c, p) + o*seqStep(c, p+o/2)
		n++
	}
	if n == 0 || work <= 0 {
		return 0
	}
	return 1e9 * float64(n) / work
}

// prefillCompute is the compute of a prompt of p tokens with nothing
// cached, in ns: engine/step.go's per-token and attention terms.
func prefillCompute(c *engine.Config, p float64) float64 {
	return p*float64(c.PrefillPerToken) + p*p/2*float64(c.AttnPerMPairs)/1e6
}

// seqStep is what one decoding sequence of ctx tokens adds to an
// iteration, in ns.
func seqStep(c *engine.Config, ctx float64) float64 {
	return float64(c.DecodePerSeq) + ctx*float64(c.DecodePerMTokens)/1e6
}

// fullRate is the fleet's arrival rate at load 1, in requests per
// second: kneeRate per replica (or workRate where the SLO cannot be met)
// times the replicas.
func fullRate(jobs []job, c *engine.Config, replicas int, slo SLO) float64 {
	r := kneeRate(jobs, c, slo)
	if r <= 0 {
		r = workRate(jobs, c)
	}
	return r * float64(replicas)
}

// scaleArrivals rewrites the arrival times of jobs (sorted by arrival) so
// that requests arrive at rate requests per second on average: every
// arrival time is multiplied by one factor. When all arrivals share one
// instant, they are spaced evenly at that rate instead. rate ≤ 0 leaves
// the times alone. It returns the factor applied (1 when none, 0 when
// spaced).
func scaleArrivals(jobs []job, rate float64) float64 {
	if rate <= 0 || len(jobs) == 0 {
		return 1
	}
	span := float64(len(jobs)) / rate * 1e9 // ns
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

// ownRate is the mean arrival rate of jobs on their own clock, in
// requests per second; 0 when they all arrive at once.
func ownRate(jobs []job) float64 {
	if len(jobs) < 2 {
		return 0
	}
	span := jobs[len(jobs)-1].at - jobs[0].at
	if span <= 0 {
		return 0
	}
	// scaleArrivals spaces n arrivals over n/(n−1) of the span at a rate.
	return float64(len(jobs)-1) / span.Seconds()
}

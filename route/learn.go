package route

import "time"

// Learner is a policy that learns from what its decisions led to: a
// predictor trained online on the latencies its requests saw
// (LLMDPredicted). The caller that commits a decision keeps the
// Features the learner took from it, and hands them back with the
// request's observed latencies when it ends (fleet does both, for the
// live router and the simulator alike).
//
// Pick stays pure: it reads the model the last Observe published, an
// immutable value, and takes no lock; a learner's model changes only
// through Observe, so given the same observations in the same order the
// decisions are the same.
type Learner interface {
	// Features returns what the learner keeps of decision d, taken on r
	// over s, to learn from its outcome. It is pure, like Pick.
	Features(r *Request, s *Snapshot, d Decision) Features
	// Observe learns from one request's outcome. It is safe for
	// concurrent use.
	Observe(o Observation)
}

// Features is what a learner keeps of a decision: the request and the
// load of the replicas it went to, as they were when it was decided.
type Features struct {
	// Tokens is the prompt length in tokens.
	Tokens int
	// Cached is the fraction of the prompt the policy saw cached where it
	// prefills, 0..1.
	Cached float64
	// Serve is the load of the replica that decodes the request (and
	// prefills it, unless Leg).
	Serve Load
	// Leg says a prefill worker computed the prompt (disaggregated), and
	// Prefill is that worker's load.
	Leg     bool
	Prefill Load
}

// Load is one replica's load as a learner's features see it.
type Load struct {
	// KVUsage is the engine's scraped KV usage, 0..1.
	KVUsage float64
	// Waiting is the engine's scraped queue.
	Waiting int
	// InFlight is the router's own count of requests in flight there.
	InFlight int
	// PrefillTokens and DecodeTokens are the router's own counts of
	// prompt tokens not yet prefilled there, and of the KV tokens its
	// requests in flight hold there.
	PrefillTokens, DecodeTokens int
}

// Observation is one request's outcome, with the features kept of its
// decision.
type Observation struct {
	Features
	// TTFT is the observed time to first token, from the decision; zero:
	// not observed.
	TTFT time.Duration
	// TPOT is the observed mean time between output tokens after the
	// first; zero: not observed (fewer than two output tokens).
	TPOT time.Duration
	// At is when the request ended on the caller's clock (time since it
	// started): a learner's retraining cadence counts on it.
	At time.Duration
}

// loadOf is replica rp's Load.
func loadOf(rp *Replica, blockTokens int) Load {
	return Load{KVUsage: rp.KVUsage, Waiting: rp.Waiting, InFlight: rp.InFlight,
		PrefillTokens: rp.PrefillTokens, DecodeTokens: rp.DecodeBlocks * blockTokens}
}

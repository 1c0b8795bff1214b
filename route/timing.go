package route

import "time"

// The timing model of an engine, from its Rates (with defaults filled):
// what kv-aware prices, the peers that estimate time, Backlog and fleet's
// calibration and admission all take their times from here.
//
//	prefill of n tokens after c cached = n×PrefillPerToken + n×(c + n/2)×AttnPerMPairs/1e6
//	decode step of B sequences holding K tokens of context = DecodeStep + B×DecodePerSeq + K×DecodePerMTokens/1e6
//	an iteration carrying a prefill = that step, or StepOverhead alone when nothing decodes
//	the queue's wait = queued×PrefillPerToken×Scale + queued/MaxBatchedTokens × an iteration of it
//
// Each formula comes in the arithmetic its callers have always used, and
// a change of it changes their decisions in the last bit (the golden
// tests): kv-aware's in float64 nanoseconds (prefillNS, stepNS, iterNS),
// the peers' and the fleet's in whole ones (PrefillTime, StepTime,
// nominalStep).

// PrefillTime is the time to prefill n new tokens after c cached ones,
// n×PrefillPerToken + n×(c+n/2)×AttnPerMPairs/1e6, the attention term
// rounded down to the nanosecond; 0 for n ≤ 0, and c < 0 counts as 0.
// r must have its defaults filled (WithDefaults).
func (r *Rates) PrefillTime(n, c int) time.Duration {
	if n <= 0 {
		return 0
	}
	pairs := float64(n) * (float64(max(c, 0)) + float64(n)/2)
	return time.Duration(n)*r.PrefillPerToken + time.Duration(pairs*float64(r.AttnPerMPairs)/1e6)
}

// StepTime is one decode iteration of batch sequences holding context
// tokens of KV in all, DecodeStep + batch×DecodePerSeq +
// context×DecodePerMTokens/1e6, rounded down to the nanosecond: the
// inter-token latency when only decodes share the iteration. r must
// have its defaults filled.
func (r *Rates) StepTime(batch, context float64) time.Duration {
	return r.DecodeStep + time.Duration(batch*float64(r.DecodePerSeq)+context*float64(r.DecodePerMTokens)/1e6)
}

// nominalStep is one decode iteration of batch sequences of
// nominalContext tokens each, for a model that does not take their
// lengths into account (the peers, Backlog's seat).
func (r *Rates) nominalStep(batch int) time.Duration {
	perSeq := r.DecodePerSeq + r.DecodePerMTokens*nominalContext/1_000_000
	return r.DecodeStep + time.Duration(batch)*perSeq
}

// nominalContext is the context, in tokens, of a sequence whose length a
// peer's model does not take into account (nominalStep).
const nominalContext = 4096

// prefillNS is the compute time of n new tokens after c cached, in ns.
func (r *Rates) prefillNS(n, c float64) float64 {
	return n*float64(r.PrefillPerToken) + n*(c+n/2)*float64(r.AttnPerMPairs)*1e-6
}

// stepNS is one decode iteration of n sequences holding context tokens of
// KV, in ns.
func (r *Rates) stepNS(n, context float64) float64 {
	return float64(r.DecodeStep) + n*float64(r.DecodePerSeq) + context*float64(r.DecodePerMTokens)*1e-6
}

// iterNS is one iteration that carries a prefill on a replica of n
// sequences holding context tokens, beside the prefill's compute: a decode
// step of them, or on an idle replica (n = 0) the step overhead alone,
// since nothing decodes (engine.Engine's iteration time).
func (r *Rates) iterNS(n, context float64) float64 {
	if n <= 0 {
		return float64(r.StepOverhead)
	}
	return r.stepNS(n, context)
}

// queueNS is the wait, in ns, for the prefill of queued tokens ahead of a
// request (queuedTokens): their compute at Scale, queued×PrefillPerToken×Scale,
// in queued/MaxBatchedTokens iterations of iter×scale each, which also
// carry the running decodes. kv-aware's model (priceWith, legAt), its
// lower bound (kvprune.go), the age its match reaches before the prefill
// starts (cached) and Backlog (iter 0 for both: the compute alone) all
// take the queue's wait from here.
func (r *Rates) queueNS(queued, iter, scale float64) float64 {
	return queued*float64(r.PrefillPerToken)*r.Scale + queued/float64(r.MaxBatchedTokens)*iter*scale
}

// queuedTokens is the prompt tokens queued ahead of a request of tokens
// prompt tokens on rp: the router's own not yet prefilled
// (Replica.PrefillTokens), and when fresh metrics show more waiting
// requests than the router's own undecided ones (othersWaiting), the
// others at the mean size of the router's queued ones, or of this
// request when it has none queued there.
func queuedTokens(rp *Replica, fresh bool, tokens float64) float64 {
	queued := float64(rp.PrefillTokens)
	if own, extra := othersWaiting(rp, fresh); extra > 0 {
		per := tokens
		if own > 0 {
			per = float64(rp.PrefillTokens) / float64(own)
		}
		queued += float64(extra) * per
	}
	return queued
}

package route

import (
	"math"
	"slices"
	"time"
)

// LLMDPredicted emulates llm-d's predicted-latency scheduling: a
// predictor trained online on the router's own requests estimates each
// candidate's TTFT and TPOT, and the request goes where it has headroom
// against its SLO.
//
// Source: llm-d/llm-d-router at ebab6879 (2026-08-22): the default
// profile of config/charts/routerlib/templates/_config.yaml with the
// latency predictor enabled (predicted-latency-producer, a strict
// prefix-cache-affinity-filter at 0.99, slo-headroom-tier-filter, a
// loose one at 0.80, latency-scorer, weighted-random-picker), the
// plugins under pkg/epp/framework/plugins (scheduling/scorer/latency,
// scheduling/filter/sloheadroomtier, scheduling/filter/prefixcacheaffinity,
// requestcontrol/dataproducer/predictedlatency) and the training
// sidecar's settings in config/charts/routerlib/values.yaml; the
// predictor is llm-d/llm-d-latency-predictor's Bayesian-ridge model type
// (training/training_server.py at 04e44cd8; the chart's default type is
// XGBoost, see docs/peers.md). The P/D pair rule is
// llm-d/llm-d-inference-scheduler's pd-slo-pair-optimizer
// (pkg/plugins/scorer/pd_slo_pair_optimizer.go at 0302f0fb,
// pd_slo_helpers.go at 032f6178); GIE issue #1923 proposed the design.
//
// A Pick, on the candidates (healthy replicas):
//
//  1. predict, per candidate, TTFT and TPOT from its features (KV usage,
//     waiting, router's in-flight requests and prefill tokens, the prompt
//     and its cached fraction there); headroom = SLO − predicted, with an
//     SLO of 0 when the request sets none (so every headroom is negative
//     and the least predicted latency wins, as in llm-d);
//  2. affinity gate at StrictAffinity: keep only candidates whose prefix
//     score reaches it, if any, unless the best of them predicts a TTFT
//     over MaxStickyPenalty above the best other;
//  3. headroom tiers: where some candidates meet both SLOs and some do
//     not, keep those that do, or (with probability Explore) those that
//     do not;
//  4. affinity gate at LooseAffinity, as 2;
//  5. score: the candidates meeting both SLOs if any; else, all missing,
//     the idle ones (no request in flight) if any; else the best bucket of
//     TPOT-only misses, TTFT-only misses, both. Within it, |headroom| of
//     TTFT and TPOT, each normalised to 0..1 over the bucket, are blended
//     TTFTWeight : TPOTWeight (a dimension with no range gets weight 0),
//     and the score is 1 − blend ("least": closest to the SLO, packing),
//     in hundredths; Most scores the blend (most headroom) among
//     candidates that meet the SLO;
//  6. pick at random in proportion to the scores (A-Res).
//
// Until its first fit the predictor is llm-d's default model, 10 ms for
// every TTFT and TPOT, so the scores tie and the draw is uniform (the
// gates still apply); llm-d's scorer has a composite fallback for a
// predictor that does not answer, which an in-process one always does.
// On a fleet with prefill workers, a request with
// an SLO takes the pair (prefill worker, decode replica) by
// TTFTWeight × TTFT headroom + TPOTWeight × TPOT headroom against the SLO
// × PairBuffer, predicted TTFT being the pair's plus PairOverhead, from
// those meeting both at random in proportion to that blend minus its
// least plus 1 ms (with probability Explore from those that do not);
// without an SLO the decode replica and the prefill worker are each picked as above (llm-d's P/D profiles), the prompt
// always prefilling remotely (the prefix-based decider's threshold 0).
//
// Emulation: llm-d's random draws are hashes of Request.Hash, so runs
// repeat; the prefix score is the approximate index's Match/Blocks in
// 64-token blocks (as LLMD); the predictor is LLMDPredicted's own
// (llmdpredicted_model.go), fed through Observe by the fleet.
// Decision.Miss is the chance that TTFT or TPOT exceeds its bound if the
// model's residuals are normal with the spread they have on its window
// (Bayesian ridge's predictive spread).
//
// The zero value is ready to use; it must not be copied after first use.
type LLMDPredicted struct {
	// TTFTWeight and TPOTWeight blend the two headrooms; zero means 0.8
	// and 0.2 (both the latency scorer's and the pair optimizer's).
	TTFTWeight, TPOTWeight float64
	// Most prefers the most headroom among candidates that meet the SLO;
	// false is llm-d's default, the least (bin packing).
	Most bool
	// StrictAffinity and LooseAffinity are the two affinity gates' prefix
	// score thresholds; zero means 0.99 and 0.80, negative disables.
	StrictAffinity, LooseAffinity float64
	// MaxStickyPenalty is how much longer a TTFT the best sticky candidate
	// may be predicted than the best other before a gate opens; zero
	// means 5 s (the chart's maxTTFTPenaltyMs).
	MaxStickyPenalty time.Duration
	// Explore is the probability of the missing tier when both exist;
	// zero means 0.01, negative never.
	Explore float64
	// PairBuffer scales the SLO a pair is held to, 0..1; zero means 0.9.
	// PairOverhead is the KV transfer time added to a pair's TTFT; zero
	// means 5 ms.
	PairBuffer   float64
	PairOverhead time.Duration
	// RetrainEvery, MinSamples and BucketSamples set the trainer: refit
	// every RetrainEvery of observation time once MinSamples are held,
	// at most BucketSamples per bucket; zero means 10 s, 10 and 500.
	RetrainEvery              time.Duration
	MinSamples, BucketSamples int

	t trainer
}

// NewLLMDPredicted returns llm-d's predicted-latency scheduler with its
// defaults and an untrained predictor.
func NewLLMDPredicted() *LLMDPredicted { return &LLMDPredicted{} }

// Reasons of LLMDPredicted's decisions.
const (
	// ReasonHeadroom: the candidate meets the request's SLOs as predicted.
	ReasonHeadroom = "headroom"
	// ReasonNoHeadroom: no candidate kept meets them as predicted (or the
	// request sets none): the least predicted deficit.
	ReasonNoHeadroom = "no-headroom"
)

// Needs asks for llm-d's approximate prefix index and 50 ms scrapes.
func (p *LLMDPredicted) Needs() Needs { return LLMD{}.Needs() }

// Observe learns from one request's outcome.
func (p *LLMDPredicted) Observe(o Observation) {
	p.t.observe(&o, trainerConfig{
		every:         orDuration(p.RetrainEvery, defaultRetrainEvery),
		minSamples:    orInt(p.MinSamples, defaultMinSamples),
		bucketSamples: orInt(p.BucketSamples, defaultBucketSamples),
	})
}

// Features returns what decision d keeps for Observe: the request, and
// the load of its replica and, for a prefill leg, the worker's.
func (p *LLMDPredicted) Features(r *Request, s *Snapshot, d Decision) Features {
	if d.Replica < 0 || d.Replica >= len(s.Replicas) {
		return Features{}
	}
	bs := blockSize(s)
	f := Features{Tokens: r.Tokens, Cached: ratioOf(r, d.Replica), Serve: loadOf(&s.Replicas[d.Replica], bs)}
	if w := d.Transfer.From; d.Transfer.Blocks > 0 && w >= 0 && w < len(s.Replicas) && s.Replicas[w].Role == RolePrefill {
		f.Leg, f.Prefill, f.Cached = true, loadOf(&s.Replicas[w], bs), ratioOf(r, w)
	}
	return f
}

// Pick routes r: by headroom pairs on a fleet with prefill workers and
// an SLO, else by the aggregated pipeline (pick; on a fleet with prefill
// workers, as both of PD's profiles).
func (p *LLMDPredicted) Pick(r *Request, s *Snapshot) Decision {
	m := p.t.current()
	if !slices.ContainsFunc(s.Replicas, func(rp Replica) bool { return rp.Prefills }) {
		return p.pick(r, s, m)
	}
	if r.SLO.IsZero() {
		return PD{Decode: llmdStage{p}, Prefill: llmdStage{p}}.Pick(r, s)
	}
	return p.pickPair(r, s, m)
}

// pick is the aggregated pipeline over s's healthy replicas.
func (p *LLMDPredicted) pick(r *Request, s *Snapshot, m *latencyModel) Decision {
	if healthy(s) == 0 {
		return rejected(r)
	}
	v := candidates{p: p, m: m, r: r, s: s, bs: blockSize(s), ttftSLO: ms(r.SLO.TTFT), tpotSLO: ms(r.SLO.ITL)}
	defer estimates.Put(v.estimateAll())
	v.strict = v.gate(orFraction(p.StrictAffinity, 0.99), stageHealthy)
	v.tier = v.tierOf()
	v.loose = v.gate(orFraction(p.LooseAffinity, 0.80), stageTier)
	v.bucket = v.bucketOf()
	return v.choose()
}

// llmdStage is LLMDPredicted's aggregated pipeline as a Policy: PD's
// decode and prefill profiles.
type llmdStage struct{ p *LLMDPredicted }

// Pick runs the pipeline with the current model.
func (l llmdStage) Pick(r *Request, s *Snapshot) Decision {
	return l.p.pick(r, s, l.p.t.current())
}

// miss is the predicted chance that a request of SLO slo misses it, its
// predicted TTFT and TPOT (ms) from models m: 1 − (1 − P(TTFT over)) ×
// (1 − P(TPOT over)), each normal with the model's residual spread.
func (m *latencyModel) miss(slo SLO, ttft, tpot float64) float64 {
	hit := 1 - exceeds(ms(slo.TTFT), ttft, m.ttft.sigma)
	if m.tpot.n > 0 {
		hit *= 1 - exceeds(ms(slo.ITL), tpot, m.tpot.sigma)
	}
	return min(max(1-hit, 0), 1)
}

// exceeds is P(y > bound) for y normal of mean and sigma; 0 when bound is 0
// (no bound).
func exceeds(bound, mean, sigma float64) float64 {
	switch {
	case bound <= 0:
		return 0
	case sigma <= 0:
		if mean > bound {
			return 1
		}
		return 0
	}
	return 0.5 * math.Erfc((bound-mean)/(sigma*math.Sqrt2))
}

// unit maps a hash to a uniform draw in (0, 1).
func unit(h uint64) float64 { return (float64(h>>11) + 0.5) / (1 << 53) }

// Salts of the request-hash draws, one per random choice of a Pick.
const (
	saltTier uint64 = 0x6c6c6d2d64746965 // "llm-dtie"
	saltPair uint64 = 0x6c6c6d2d64706169 // "llm-dpai"
)

func orDuration(v, def time.Duration) time.Duration {
	if v > 0 {
		return v
	}
	return def
}

func orInt(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// orFraction is v, def when v is zero, and 0 (off) when v is negative.
func orFraction(v, def float64) float64 {
	switch {
	case v < 0:
		return 0
	case v == 0:
		return def
	}
	return v
}

var (
	_ Policy  = (*LLMDPredicted)(nil)
	_ Needer  = (*LLMDPredicted)(nil)
	_ Learner = (*LLMDPredicted)(nil)
	_ Policy  = llmdStage{}
)

// Package report turns per-request samples of a fleet run (simulated or
// replayed) into per-policy results, and writes them as a terminal table,
// as JSON for machines and as one self-contained HTML page with charts.
//
// The JSON field names are a stable interface (documented on each field's
// tag): scripts and CI compare runs with them. Durations are milliseconds
// with three decimals, rates and fractions are rounded to six decimals and
// maps are written with sorted keys, so one run's JSON is byte-identical
// every time.
package report

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"time"
)

// Oracle names used for the "% of pooled oracle" headline.
const (
	// OracleInfinite is the hit rate with unlimited cache memory.
	OracleInfinite = "infinite"
	// OraclePooled is the hit rate of one engine holding the whole fleet's
	// KV capacity.
	OraclePooled = "pooled"
)

// Sample is what one request produced. Rejected requests and errors are
// samples too, so a policy cannot look better by shedding load.
type Sample struct {
	// At is the arrival time, from the start of the run.
	At time.Duration
	// TTFT is the time from arrival to the first output token; E2E to the
	// last (or to the failure, for errors).
	TTFT, E2E time.Duration
	// ITL is the request's mean inter-token latency: (E2E − TTFT) /
	// (Output − 1); zero when Output ≤ 1.
	ITL time.Duration
	// Prompt is the prompt length, Cached the prompt tokens the engine
	// served from its cache, PredictedCached those the router predicted,
	// Output the tokens generated; all in tokens.
	Prompt, Cached, PredictedCached, Output int
	// Replica is the index of the replica that served it, -1 if none.
	Replica int
	// OK is true when the request completed. A request that is neither OK
	// nor Rejected is an error (a replica died under it, the engine refused
	// it, ...).
	OK bool
	// Rejected is true when the policy or the fleet refused the request.
	Rejected bool
	// Reason is the routing decision's reason ("prefix", "least-loaded").
	Reason string
	// Class is the request's SLO class and SLO its bounds, which it is
	// held to instead of the run's; empty and zero: the run's.
	Class string
	SLO   SLO
	// SLOQueued is true when the router held the request in its queue
	// because no replica was predicted to meet its SLO (--slo-admission
	// queue), whatever came of it.
	SLOQueued bool
}

// bounds is the SLO s is held to: its own, when it has a class, else
// run (already defaulted).
func (s *Sample) bounds(run SLO) SLO {
	if s.Class != "" {
		return s.SLO.orDefault()
	}
	return run
}

// meets reports whether s completed within its bounds.
func (s *Sample) meets(run SLO) bool {
	b := s.bounds(run)
	return s.OK && s.TTFT <= b.TTFT && s.ITL <= b.ITL
}

// SLO is the service-level objective of goodput.
type SLO struct {
	// TTFT is the largest acceptable time to first token; zero means 2 s.
	TTFT time.Duration
	// ITL is the largest acceptable mean inter-token latency; zero means
	// 100 ms.
	ITL time.Duration
}

// MarshalJSON writes s as {"ttft_ms": ..., "itl_ms": ...}.
func (s SLO) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		TTFT Millis `json:"ttft_ms"`
		ITL  Millis `json:"itl_ms"`
	}{Millis(s.TTFT), Millis(s.ITL)})
}

func (s SLO) orDefault() SLO {
	if s.TTFT <= 0 {
		s.TTFT = 2 * time.Second
	}
	if s.ITL <= 0 {
		s.ITL = 100 * time.Millisecond
	}
	return s
}

// Millis is a duration written to JSON as milliseconds with three decimals.
type Millis time.Duration

// MarshalJSON writes m in milliseconds, e.g. 1234.568.
func (m Millis) MarshalJSON() ([]byte, error) {
	return strconv.AppendFloat(nil, float64(m)/1e6, 'f', 3, 64), nil
}

// D returns m as a time.Duration.
func (m Millis) D() time.Duration { return time.Duration(m) }

// Dist summarises a latency distribution. Percentiles are nearest-rank: the
// p-th percentile of n sorted values is value number ⌈p·n/100⌉ (1-based), a
// value that really occurred.
type Dist struct {
	P50  Millis `json:"p50"`
	P90  Millis `json:"p90"`
	P99  Millis `json:"p99"`
	Mean Millis `json:"mean"`
}

// Result is one policy's figures over a run.
type Result struct {
	// Policy names the routing policy.
	Policy string `json:"policy"`
	// Requests counts all samples; Completed, Rejected and Errors split
	// them.
	Requests  int `json:"requests"`
	Completed int `json:"completed"`
	Rejected  int `json:"rejected"`
	Errors    int `json:"errors"`
	// TTFT, E2E and ITL are over completed requests (ITL over those with
	// more than one output token).
	TTFT Dist `json:"ttft_ms"`
	E2E  Dist `json:"e2e_ms"`
	ITL  Dist `json:"itl_ms"`
	// HitRate is cached prompt tokens / prompt tokens over completed
	// requests, 0..1; PredictedHitRate is the router's prediction.
	HitRate          float64 `json:"hit_rate"`
	PredictedHitRate float64 `json:"predicted_hit_rate"`
	// NoPrediction is true when the policy predicts no cached tokens (it
	// reads no residency index, or the endpoint replayed against said
	// nothing of its decisions): PredictedHitRate is then zero and the
	// writers leave it blank rather than print 0%.
	NoPrediction bool `json:"no_prediction,omitempty"`
	// PooledPct is HitRate as a percentage of the pooled oracle's hit rate
	// (filled by the writers from Run.Oracles; zero without that oracle).
	PooledPct float64 `json:"pooled_pct"`
	// PromptTokens, CachedTokens and OutputTokens are totals over completed
	// requests; PrefillTokens = PromptTokens − CachedTokens is the prefill
	// work the fleet actually did.
	PromptTokens  int64 `json:"prompt_tokens"`
	CachedTokens  int64 `json:"cached_tokens"`
	PrefillTokens int64 `json:"prefill_tokens"`
	OutputTokens  int64 `json:"output_tokens"`
	// Duration is the run's span: first arrival to last completion.
	Duration Millis `json:"duration_ms"`
	// Throughput is output tokens per second over Duration.
	Throughput float64 `json:"throughput_tok_s"`
	// Goodput is completed requests meeting the SLO per second over
	// Duration; SLOMet is their fraction of all requests, 0..1.
	Goodput float64 `json:"goodput_req_s"`
	SLOMet  float64 `json:"slo_met"`
	// Transfers and TransferBytes count the KV imports between replicas
	// the policy ordered and the engines made, and their size.
	Transfers     int   `json:"transfers"`
	TransferBytes int64 `json:"transfer_bytes"`
	// MaxLoad and MeanLoad are the in-flight requests of the busiest
	// replica and of the average replica, each averaged over time;
	// MaxLoad/MeanLoad is the imbalance (1 is perfect). PeakLoad is the
	// most requests ever in flight on one replica.
	MaxLoad  float64 `json:"max_load"`
	MeanLoad float64 `json:"mean_load"`
	PeakLoad int     `json:"peak_load"`
	// Reasons counts decisions by reason (written with sorted keys).
	Reasons map[string]int `json:"reasons"`
	// PerReplica counts the requests each replica served.
	PerReplica []int `json:"per_replica"`
	// Classes is the attainment of each SLO class, by name; empty when
	// no request has a class.
	Classes []ClassResult `json:"classes,omitempty"`
	// SLOQueued counts the requests held in the router's queue because no
	// replica was predicted to meet their SLO (Sample.SLOQueued); those
	// it rejected for it are Rejected, with reason "slo-unattainable".
	SLOQueued int `json:"slo_queued,omitempty"`
	// Learned is what the router had learned of each replica by the end
	// of the run (a simulation's; empty otherwise).
	Learned []Learned `json:"learned,omitempty"`
	// Series feeds the HTML charts; it is not written to JSON.
	Series Series `json:"-"`
}

// Learned is what the router learned of one replica online (see
// route.Rates): its prefill and decode speeds against the preset's, its
// eviction horizon, the share of its evicted tokens asked for again, and
// the correction of its predicted cache hits.
type Learned struct {
	Scale       float64 `json:"scale"`
	DecodeScale float64 `json:"decode_scale"`
	HorizonMS   float64 `json:"horizon_ms"`
	// TierHorizonMS is Rates.TierHorizon in ms; absent without a CPU tier.
	TierHorizonMS float64 `json:"tier_horizon_ms,omitempty"`
	Displaced     float64 `json:"displaced"`
	HitScale      float64 `json:"hit_scale"`
}

// Series holds a policy's chart data.
type Series struct {
	// TTFT is the CDF of completed requests' TTFT, at most 200 points in
	// increasing order.
	TTFT []Point
	// Bucket is the width of one load bucket; Load[r][b] is replica r's
	// time-averaged in-flight requests during bucket b.
	Bucket time.Duration
	Load   [][]float64
}

// Point is one point of a CDF: X in milliseconds, Y a fraction 0..1.
type Point struct{ X, Y float64 }

// Param is one run parameter, shown in the report header.
type Param struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Oracle is a ceiling the policies' hit rates are judged against.
type Oracle struct {
	// Name is OracleInfinite, OraclePooled or another ceiling.
	Name string `json:"name"`
	// HitRate is the fraction of prompt tokens it serves from cache, 0..1.
	HitRate float64 `json:"hit_rate"`
}

// Run is a whole comparison: its parameters, the oracles and one Result per
// policy, in the order given.
type Run struct {
	// Title heads the HTML page; empty means "kvrouter simulation".
	Title  string  `json:"title,omitempty"`
	Params []Param `json:"params"`
	// SLO, if set, is the goodput objective the results were measured
	// against, shown above the table.
	SLO      *SLO     `json:"slo,omitempty"`
	Oracles  []Oracle `json:"oracles"`
	Policies []Result `json:"policies"`
	// Rank names the latency metric (a Metrics() name: ttft_p99,
	// ttft_mean, e2e_p99) the verdict ranks the policies by, in every
	// writer (Headline, Winner); empty means ttft_p99.
	Rank string `json:"rank,omitempty"`
}

// rankMetric is the metric r.Rank names, ttft_p99 when it names none.
func (r *Run) rankMetric() Metric {
	ms := Metrics()
	for _, m := range ms {
		if m.Name == r.Rank && !m.Higher {
			return m
		}
	}
	return ms[0]
}

// Winner is how the policies of run stand on the metric the verdict
// ranks them by (Run.Rank): the winner the headline names.
func Winner(run *Run) *Standing {
	r := run.normalized()
	return stand(&r, r.rankMetric())
}

// pooled returns the pooled oracle's hit rate, zero when absent.
func (r *Run) pooled() float64 {
	for _, o := range r.Oracles {
		if o.Name == OraclePooled {
			return o.HitRate
		}
	}
	return 0
}

// normalized returns a copy of r with PooledPct filled and every float
// rounded, as the writers print it.
func (r *Run) normalized() Run {
	out := *r
	if out.Title == "" {
		out.Title = "kvrouter simulation"
	}
	out.Oracles = make([]Oracle, len(r.Oracles))
	for i, o := range r.Oracles {
		o.HitRate = round6(o.HitRate)
		out.Oracles[i] = o
	}
	pooled := r.pooled()
	out.Policies = make([]Result, len(r.Policies))
	for i, p := range r.Policies {
		if pooled > 0 && p.PooledPct == 0 {
			p.PooledPct = 100 * p.HitRate / pooled
		}
		for _, f := range []*float64{&p.HitRate, &p.PredictedHitRate, &p.PooledPct, &p.Throughput, &p.Goodput, &p.SLOMet, &p.MaxLoad, &p.MeanLoad} {
			*f = round6(*f)
		}
		p.Classes = slices.Clone(p.Classes)
		for k := range p.Classes {
			p.Classes[k].SLOMet = round6(p.Classes[k].SLOMet)
		}
		if p.Reasons == nil {
			p.Reasons = map[string]int{}
		}
		if p.PerReplica == nil {
			p.PerReplica = []int{}
		}
		out.Policies[i] = p
	}
	if out.Params == nil {
		out.Params = []Param{}
	}
	return out
}

// round6 rounds x to six decimals; NaN and infinities become zero.
func round6(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return 0
	}
	return math.Round(x*1e6) / 1e6
}

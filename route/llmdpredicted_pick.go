package route

import (
	"math"
	"sync"
	"time"
)

// candidates is one aggregated Pick of LLMDPredicted in progress: every
// replica's estimate, and the gates it has decided so far.
type candidates struct {
	est []estimate // per replica; from estimates
	p   *LLMDPredicted
	m   *latencyModel
	r   *Request
	s   *Snapshot
	bs  int
	// ttftSLO and tpotSLO are the request's bounds in ms, 0 for none.
	ttftSLO, tpotSLO float64
	// strict and loose are the affinity gates' thresholds, 0 when the gate
	// keeps every candidate.
	strict, loose float64
	tier          tier
	bucket        bucket
}

// Stages of the pipeline: a candidate is kept at a stage when it passed
// every gate up to it.
const (
	stageHealthy = iota
	stageStrict
	stageTier
	stageLoose
	stageBucket
)

// estimate is one candidate's prediction, in ms.
type estimate struct {
	ttft, tpot         float64
	ttftRoom, tpotRoom float64 // SLO − predicted
	prefix             float64 // the prefix score, 0..1
	idle               bool    // no request of the router's in flight
	healthy            bool    // a candidate
}

// estimates keeps candidates' estimate slices between Picks, so that a
// Pick allocates nothing.
var estimates = sync.Pool{New: func() any { return new([]estimate) }}

// estimateAll fills v.est from estimates; release puts it back.
func (v *candidates) estimateAll() *[]estimate {
	buf := estimates.Get().(*[]estimate)
	if n := len(v.s.Replicas); cap(*buf) < n {
		*buf = make([]estimate, n)
	}
	v.est = (*buf)[:len(v.s.Replicas)]
	for i := range v.s.Replicas {
		v.est[i] = estimate{}
		if v.s.Replicas[i].Healthy {
			v.est[i] = v.estimate(i)
		}
	}
	*buf = v.est
	return buf
}

// meets says both headrooms are non-negative (llm-d's positive tier).
func (e *estimate) meets() bool { return e.ttftRoom >= 0 && e.tpotRoom >= 0 }

// estimate predicts replica i.
func (v *candidates) estimate(i int) estimate {
	rp := &v.s.Replicas[i]
	e := estimate{prefix: ratioOf(v.r, i), idle: rp.InFlight == 0, healthy: true}
	f := Features{Tokens: v.r.Tokens, Cached: e.prefix, Serve: loadOf(rp, v.bs)}
	x, y := ttftX(&f), tpotX(&f)
	e.ttft, e.tpot = v.m.ttft.predict(&x), v.m.tpot.predict(&y)
	e.ttftRoom, e.tpotRoom = v.ttftSLO-e.ttft, v.tpotSLO-e.tpot
	return e
}

// keeps says a candidate of estimate e passed the gates up to stage.
func (v *candidates) keeps(e *estimate, stage int) bool {
	switch {
	case stage >= stageStrict && v.strict > 0 && e.prefix < v.strict,
		stage >= stageTier && !v.tier.keeps(e),
		stage >= stageLoose && v.loose > 0 && e.prefix < v.loose,
		stage >= stageBucket && !v.bucket.keeps(e):
		return false
	}
	return true
}

// each calls fn with every healthy replica kept at stage and its estimate.
func (v *candidates) each(stage int, fn func(i int, e estimate)) {
	for i := range v.est {
		if e := &v.est[i]; e.healthy && v.keeps(e, stage) {
			fn(i, *e)
		}
	}
}

// gate is the prefix-cache affinity filter at threshold over the
// candidates kept at stage: threshold if it keeps only the sticky ones,
// 0 if it keeps all (no sticky candidate, a single candidate, or the
// best sticky predicted over MaxStickyPenalty slower than the best
// other).
func (v *candidates) gate(threshold float64, stage int) float64 {
	if threshold <= 0 {
		return 0
	}
	n, sticky := 0, 0
	bestSticky, bestOther := math.MaxFloat64, math.MaxFloat64
	v.each(stage, func(_ int, e estimate) {
		n++
		if e.prefix >= threshold {
			sticky++
			bestSticky = min(bestSticky, e.ttft)
		} else {
			bestOther = min(bestOther, e.ttft)
		}
	})
	penalty := ms(orDuration(v.p.MaxStickyPenalty, 5*time.Second))
	if n <= 1 || sticky == 0 || sticky < n && bestSticky-bestOther > penalty {
		return 0
	}
	return threshold
}

// tier is what the headroom tier filter keeps.
type tier uint8

const (
	tierAll tier = iota
	tierMeets
	tierMisses
)

func (t tier) keeps(e *estimate) bool {
	switch t {
	case tierMeets:
		return e.meets()
	case tierMisses:
		return !e.meets()
	}
	return true
}

// tierOf is the slo-headroom-tier-filter over the candidates the strict
// gate kept: the tier that meets both SLOs when both tiers have
// candidates, or with probability Explore the other; all when one tier
// is empty.
func (v *candidates) tierOf() tier {
	meets, misses := 0, 0
	v.each(stageStrict, func(_ int, e estimate) {
		if e.meets() {
			meets++
		} else {
			misses++
		}
	})
	switch {
	case meets == 0 || misses == 0:
		return tierAll
	case unit(Mix64(v.r.Hash^saltTier)) < orFraction(v.p.Explore, 0.01):
		return tierMisses
	}
	return tierMeets
}

// bucket is the set the latency scorer scores.
type bucket uint8

const (
	bucketMeets bucket = iota // meets both SLOs
	bucketIdle                // misses, no request in flight
	bucketTPOT                // misses TPOT only
	bucketTTFT                // misses TTFT only
	bucketBoth                // misses both
)

func (b bucket) keeps(e *estimate) bool {
	switch b {
	case bucketMeets:
		return e.meets()
	case bucketIdle:
		return e.idle
	case bucketTPOT:
		return e.ttftRoom >= 0 && e.tpotRoom < 0
	case bucketTTFT:
		return e.ttftRoom < 0 && e.tpotRoom >= 0
	case bucketBoth:
		return e.ttftRoom < 0 && e.tpotRoom < 0
	}
	return true
}

// bucketOf is the latency scorer's choice of whom to score among the
// candidates the loose gate kept: those that meet both SLOs; else the
// idle; else the first non-empty of TPOT-only, TTFT-only and both
// misses.
func (v *candidates) bucketOf() bucket {
	var n [bucketBoth + 1]int
	v.each(stageLoose, func(_ int, e estimate) {
		for _, b := range [...]bucket{bucketMeets, bucketIdle, bucketTPOT, bucketTTFT, bucketBoth} {
			if b.keeps(&e) && (b != bucketIdle || !e.meets()) {
				n[b]++
			}
		}
	})
	if n[bucketMeets] > 0 {
		return bucketMeets
	}
	for _, b := range [...]bucket{bucketIdle, bucketTPOT, bucketTTFT} {
		if n[b] > 0 {
			return b
		}
	}
	return bucketBoth
}

// choose scores the bucket and draws from it in proportion to the
// scores (A-Res: the least −ln(U)/score, U from the request's hash).
func (v *candidates) choose() Decision {
	sc := v.scoring()
	c := newChooser(v.r, len(v.s.Replicas))
	v.each(stageBucket, func(i int, e estimate) {
		key := -math.Log(unit(tieKey(v.r.Hash, i))) / sc.score(&e)
		c.offer(i, key, matchOf(v.r, i)*v.bs)
	})
	reason := ReasonNoHeadroom
	if v.bucket == bucketMeets {
		reason = ReasonHeadroom
	}
	d := c.decision(reason, matchOf(v.r, c.best)*v.bs)
	if d.Replica >= 0 && !v.r.SLO.IsZero() {
		e := &v.est[d.Replica]
		d.Miss = v.m.miss(v.r.SLO, e.ttft, e.tpot)
	}
	return d
}

// scoring is what the bucket's score needs of the whole bucket: the
// ranges of |headroom| (TTFT, TPOT) and the blend weights.
type scoring struct {
	lo, hi      [2]float64
	alpha, beta float64
	most        bool
}

// scoring measures the bucket.
func (v *candidates) scoring() scoring {
	sc := scoring{lo: [2]float64{math.MaxFloat64, math.MaxFloat64}, hi: [2]float64{-math.MaxFloat64, -math.MaxFloat64}}
	v.each(stageBucket, func(_ int, e estimate) {
		for k, h := range [2]float64{math.Abs(e.ttftRoom), math.Abs(e.tpotRoom)} {
			sc.lo[k], sc.hi[k] = min(sc.lo[k], h), max(sc.hi[k], h)
		}
	})
	sc.alpha, sc.beta = v.p.weights()
	switch {
	case sc.flat(0) && !sc.flat(1):
		sc.alpha, sc.beta = 0, 1
	case sc.flat(1) && !sc.flat(0):
		sc.alpha, sc.beta = 1, 0
	}
	sc.most = v.p.Most && v.bucket == bucketMeets
	return sc
}

// flat says dimension k (0 TTFT, 1 TPOT) has no range over the bucket.
func (sc *scoring) flat(k int) bool { return sc.hi[k]-sc.lo[k] <= 1e-9 }

// score is a candidate's score, 0.01..1.01: 1 − the blend of its
// |headroom|s normalised over the bucket ("least"; the blend itself for
// Most), in hundredths plus one.
func (sc *scoring) score(e *estimate) float64 {
	blend := 0.0
	for k, h := range [2]float64{math.Abs(e.ttftRoom), math.Abs(e.tpotRoom)} {
		norm := 0.5
		if !sc.flat(k) {
			norm = (h - sc.lo[k]) / (sc.hi[k] - sc.lo[k])
		}
		blend += [2]float64{sc.alpha, sc.beta}[k] * norm
	}
	if !sc.most {
		blend = 1 - blend
	}
	return float64(int(blend*100)+1) / 100
}

// weights are TTFTWeight and TPOTWeight with defaults, normalised to sum
// 1 (1, 0 when both are negative or zero after defaults).
func (p *LLMDPredicted) weights() (alpha, beta float64) {
	a, b := p.TTFTWeight, p.TPOTWeight
	if a == 0 && b == 0 {
		a, b = 0.8, 0.2
	}
	a, b = max(a, 0), max(b, 0)
	if a+b <= 0 {
		return 1, 0
	}
	return a / (a + b), b / (a + b)
}

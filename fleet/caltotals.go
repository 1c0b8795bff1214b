package fleet

import (
	"math"
	"sync"
	"sync/atomic"
)

// calTotals pools the learned log scales (Scale, or DecodeScale) of the
// calibrated replicas, for two uses.
//
// A snapshot gives the uncalibrated replicas their mean (priors) without
// a logarithm per replica. Without it, once one replica is calibrated
// (say to 0.3: the engines are faster than the preset), every
// uncalibrated one looks 3× slower and gets no traffic to calibrate on.
//
// And a replica's own scale is shrunk towards that mean by how much of
// the replicas' spread its estimate's noise explains (shrink): each is a
// mean of a few dozen noisy ratios, and on a fleet of equal replicas
// their differences are noise, a few percent, which on a decode of
// seconds outweighs the prefix a request would reuse; taken as speed,
// they send requests after it. A replica that really differs (another
// GPU, a noisy neighbour) makes a spread its noise does not explain, and
// keeps its own. One that differs far more than the pool's spread and
// its own noise allow (outlier) is kept out of the pool: a single slow
// replica would otherwise inflate the spread and stop the pooling of all
// the others.
//
// The spreads of the replicas' prediction errors (Calibrator.Spread) are
// pooled alike, for the first use: an uncalibrated replica's spread is
// the prior's (route.PriorSpread, a factor 4 for two sigmas), three times
// what a calibrated one learns within a window, so its miss probability
// well under a bound is many times theirs and kv-aware would keep
// requests off it for being unknown, not for being slow. Replicas of one
// fleet run one model on like engines, so what the others' errors show is
// the better guess; the prior stands until one replica has learned.
//
// mu guards the sums; mean, spread and count are what snapshots read.
type calTotals struct {
	mu      sync.Mutex
	sum     float64       // log scales
	sum2    float64       // their squares
	vars    float64       // their estimates' variances (finite ones)
	spread2 float64       // their spreads' squares
	n       int           // replicas counted
	nv      int           // of them, with a finite variance
	mean    atomic.Uint64 // float64 bits of exp(sum/n)
	spread  atomic.Uint64 // float64 bits of √(spread2/n)
	count   atomic.Int64  // n
}

// share is one replica's contribution to a calTotals.
type share struct {
	log, v float64 // log of the scale counted, and its variance
	sp2    float64 // the square of its spread
	in     bool    // counted
}

// outlierZ is how many standard deviations from the pool's mean a log
// scale must lie to be kept out of the pool (calTotals.outlier), on a
// pool large enough to know its spread: a chance of about 6 in 100,000
// for a replica that is like the others.
const outlierZ = 4

// set replaces s's contribution to t with c's learned scale when c has
// observed anything, and with none otherwise (nil c: drop it); it
// returns c's scale shrunk towards the fleet's (1 for nil c).
func (s *share) set(t *calTotals, c *Calibrator) float64 {
	calibrated := c != nil && c.Observations() > 0
	l, v, sp := 0.0, math.Inf(1), 0.0
	if calibrated {
		l, v, sp = math.Log(c.Scale()), c.Variance(), c.Spread()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s.in {
		t.add(s.log, s.v, s.sp2, -1)
	}
	outlier := calibrated && t.outlier(l, v)
	if calibrated && !outlier {
		t.add(l, v, sp*sp, 1)
	}
	s.log, s.v, s.sp2, s.in = l, v, sp*sp, calibrated && !outlier
	if t.n > 0 {
		t.mean.Store(math.Float64bits(math.Exp(t.sum / float64(t.n))))
		t.spread.Store(math.Float64bits(math.Sqrt(max(t.spread2, 0) / float64(t.n))))
	}
	t.count.Store(int64(t.n))
	switch {
	case !calibrated:
		return 1
	case outlier:
		return math.Exp(l)
	}
	return math.Exp(t.shrink(l, v))
}

// outlier says whether log scale l of variance v lies further from the
// pool's mean than its departure's deviation (the pool's spread τ², l's
// own noise v, and the mean's) makes likelier than outlierZ standard
// deviations would be. The pool's spread is itself estimated from its n
// members, so the limit is Student's t at n − 1 degrees of freedom, to
// the Cornish–Fisher expansion's first term: z·(1 + (z² + 1)/(4(n − 1))),
// 12.5 deviations for a pool of three, 5.1 for sixteen, 4.0 for a
// thousand. With fewer than two estimates of known variance in the pool
// there is no spread to judge by, and nothing is. t.mu is held.
func (t *calTotals) outlier(l, v float64) bool {
	if t.nv < 2 || t.n < 2 || math.IsInf(v, 1) {
		return false
	}
	n := float64(t.n)
	m, noise := t.sum/n, t.vars/float64(t.nv)
	tau2 := max(t.sum2/n-m*m-noise, 0)
	limit := outlierZ * (1 + (outlierZ*outlierZ+1)/(4*(n-1)))
	d := l - m
	return d*d > limit*limit*(tau2+v+(tau2+noise)/n)
}

// add counts (sign 1) or uncounts (−1) log scale l of variance v and
// squared spread sp2; t.mu is held.
func (t *calTotals) add(l, v, sp2 float64, sign int) {
	f := float64(sign)
	t.sum += f * l
	t.sum2 += f * l * l
	t.spread2 += f * sp2
	t.n += sign
	if !math.IsInf(v, 1) {
		t.vars += f * v
		t.nv += sign
	}
	if t.n == 0 { // no rounding left behind
		t.sum, t.sum2, t.vars, t.spread2, t.nv = 0, 0, 0, 0, 0
	}
}

// shrink is the empirical Bayes estimate of a replica's log scale from
// its own l, of variance v, and the pooled ones: the pooled mean m plus
// τ²/(τ²+v) of l's departure from it, where τ² is the spread of the
// replicas' true scales: the spread of their estimates less the mean of
// the estimates' variances, at least 0. With fewer than two estimates of
// known variance there is nothing to pool and l stands. t.mu is held.
func (t *calTotals) shrink(l, v float64) float64 {
	if t.nv < 2 || t.n < 2 {
		return l
	}
	n := float64(t.n)
	m := t.sum / n
	tau2 := max(t.sum2/n-m*m-t.vars/float64(t.nv), 0)
	if math.IsInf(v, 1) {
		return m
	}
	if tau2+v <= 0 {
		return l
	}
	return m + tau2/(tau2+v)*(l-m)
}

// prior returns the scale and the spread uncalibrated replicas of a fleet
// of total take: the calibrated ones' geometric mean and root mean square
// spread, or zeros when none or all are calibrated (nothing to give).
func (c *calTotals) prior(total int) (scale, spread float64) {
	if n := c.count.Load(); n == 0 || n >= int64(total) {
		return 0, 0
	}
	return math.Float64frombits(c.mean.Load()), math.Float64frombits(c.spread.Load())
}

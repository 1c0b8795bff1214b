package route

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// The latency predictor of LLMDPredicted: llm-d's training and prediction
// sidecars (llm-d/llm-d-latency-predictor at 04e44cd8,
// training/training_server.py, its Bayesian-ridge model type) run in
// process. Until its first fit it is the training server's default
// model, fitted on one sample of 10 ms: every TTFT and TPOT is 10 ms.
// Samples are kept in a stratified sliding window: one bucket per
// (queue, KV usage, prefix score) class, each holding its latest
// BucketSamples. Every RetrainEvery of the samples' own clock, once
// MinSamples are held, two linear models are refitted over the whole
// window by ridge regression on standardised features, and published as
// an immutable value that Pick reads without a lock.
//
//	TTFT (ms) = b + w·[kv, tokens, waiting, in flight, cached, (1−cached)×tokens, prefill tokens in flight,
//	                   decode tokens in flight, queued, leg, leg×decode kv, leg×decode waiting, leg×decode in flight]
//	TPOT (ms) = b + w·[kv, tokens, waiting, in flight, prefill tokens in flight, decode tokens in flight, queued]
//
// queued is 1 when the replica has requests waiting (the training
// server's is_queued). The load columns of TTFT are those of the replica
// that prefills (the prefill worker for a leg), those of TPOT the
// decoding replica's. A linear model is a sum, so for a leg it is llm-d's
// P/D predictors' prefill TTFT plus decode TTFT in one fit.

// Feature counts of the two models; maxFeatures is the larger.
const (
	ttftFeatures = 13
	tpotFeatures = 7
	maxFeatures  = ttftFeatures
)

// Defaults of the trainer: llm-d-router's Helm chart values for the
// training sidecar (config/charts/routerlib/values.yaml),
// LATENCY_RETRAINING_INTERVAL_SEC 10 and
// LATENCY_MAX_TRAINING_DATA_SIZE_PER_BUCKET 500; and the training
// server's LATENCY_MIN_SAMPLES_FOR_RETRAIN_FRESH, 10, which replaces the
// chart's 100 for good when the server starts without a saved model, as
// a router's starts.
const (
	defaultRetrainEvery  = 10 * time.Second
	defaultMinSamples    = 10
	defaultBucketSamples = 500
)

// untrainedMS is the training server's default model's prediction of
// TTFT and of TPOT, in ms.
const untrainedMS = 10

// Buckets of the window: the training server's queue classes {0, 1–2,
// 3–5, 6–10, 11+}, KV usage in steps of 5%, prefix score in quartiles.
const (
	queueClasses  = 5
	kvClasses     = 20
	prefixClasses = 4
	bucketCount   = queueClasses * kvClasses * prefixClasses
)

// ridgePrior is the ridge penalty on each standardised coefficient, in
// samples: small enough that a fit of tens of samples or more is least
// squares, as sklearn's BayesianRidge makes it when the data determine
// the weights (it learns the penalty from them), yet it keeps the first
// fits, of fewer samples than features, solvable.
const ridgePrior = 1e-3

// linear is one fitted model: y = b + w·x, in ms; sigma is the standard
// deviation of its residuals over the window it was fitted on, n that
// window's samples (zero: never fitted, predicts nothing).
type linear struct {
	w     [maxFeatures]float64
	b     float64
	sigma float64
	n     int
}

// predict is the model at x, at least 0.
func (l *linear) predict(x *[maxFeatures]float64) float64 {
	y := l.b
	for j, w := range l.w {
		y += w * x[j]
	}
	return max(y, 0)
}

// latencyModel is the published pair of models.
type latencyModel struct{ ttft, tpot linear }

// untrained is the model before the first fit; it is never modified.
var untrained = latencyModel{ttft: linear{b: untrainedMS, n: 1}, tpot: linear{b: untrainedMS, n: 1}}

// ttftX and tpotX are f's feature vectors.
func ttftX(f *Features) (x [maxFeatures]float64) {
	p := &f.Serve
	if f.Leg {
		p = &f.Prefill
	}
	tokens := float64(f.Tokens)
	x = [maxFeatures]float64{p.KVUsage, tokens, float64(p.Waiting), float64(p.InFlight), f.Cached,
		(1 - f.Cached) * tokens, float64(p.PrefillTokens), float64(p.DecodeTokens), isQueued(p)}
	if f.Leg {
		x[9], x[10], x[11], x[12] = 1, f.Serve.KVUsage, float64(f.Serve.Waiting), float64(f.Serve.InFlight)
	}
	return x
}

func tpotX(f *Features) [maxFeatures]float64 {
	s := &f.Serve
	return [maxFeatures]float64{s.KVUsage, float64(f.Tokens), float64(s.Waiting), float64(s.InFlight),
		float64(s.PrefillTokens), float64(s.DecodeTokens), isQueued(s)}
}

// isQueued is 1 when l has requests waiting, else 0.
func isQueued(l *Load) float64 {
	if l.Waiting > 0 {
		return 1
	}
	return 0
}

// sample is one observation in the window, its latencies in ms (zero:
// not observed).
type sample struct {
	f          Features
	ttft, tpot float64
}

// trainer is the window and the published model. Observe's callers
// share it (the proxy's request goroutines): mu guards everything but
// model, which Pick loads without a lock.
type trainer struct {
	mu      sync.Mutex
	buckets [bucketCount][]sample
	next    [bucketCount]int32 // each full bucket's oldest sample
	held    int
	fitAt   time.Duration
	model   atomic.Pointer[latencyModel]
}

// current is the published model, or the untrained one.
func (t *trainer) current() *latencyModel {
	if m := t.model.Load(); m != nil {
		return m
	}
	return &untrained
}

// trainerConfig is when the trainer refits and how much it keeps.
type trainerConfig struct {
	every         time.Duration
	minSamples    int
	bucketSamples int
}

// observe adds o to the window and refits when due: RetrainEvery after
// the last fit (or the start), with MinSamples held.
func (t *trainer) observe(o *Observation, c trainerConfig) {
	if o.TTFT <= 0 && o.TPOT <= 0 {
		return
	}
	s := sample{f: o.Features, ttft: ms(o.TTFT), tpot: ms(o.TPOT)}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.addLocked(s, c.bucketSamples)
	if t.held < c.minSamples || o.At-t.fitAt < c.every {
		return
	}
	t.fitAt = o.At
	m := &latencyModel{}
	m.ttft = t.fitLocked(ttftFeatures, func(s *sample) ([maxFeatures]float64, float64) { return ttftX(&s.f), s.ttft })
	m.tpot = t.fitLocked(tpotFeatures, func(s *sample) ([maxFeatures]float64, float64) { return tpotX(&s.f), s.tpot })
	t.model.Store(m)
}

// ms is d in milliseconds; zero or less is 0.
func ms(d time.Duration) float64 { return max(float64(d)/1e6, 0) }

// addLocked puts s in its bucket, in place of the oldest when it is full.
func (t *trainer) addLocked(s sample, capacity int) {
	k := bucketOf(&s.f)
	b := &t.buckets[k]
	if len(*b) < capacity {
		*b = append(*b, s)
		t.held++
		return
	}
	(*b)[t.next[k]] = s
	t.next[k] = int32((int(t.next[k]) + 1) % len(*b))
}

// bucketOf is the window bucket of f: its prefilling replica's queue
// class, KV usage class and prefix-score quartile.
func bucketOf(f *Features) int {
	p := &f.Serve
	if f.Leg {
		p = &f.Prefill
	}
	q := 4
	switch w := p.Waiting; {
	case w <= 0:
		q = 0
	case w <= 2:
		q = 1
	case w <= 5:
		q = 2
	case w <= 10:
		q = 3
	}
	kv := min(max(int(p.KVUsage*kvClasses), 0), kvClasses-1)
	pre := min(max(int(f.Cached*prefixClasses), 0), prefixClasses-1)
	return (q*kvClasses+kv)*prefixClasses + pre
}

// each calls fn on every sample of the window.
func (t *trainer) eachLocked(fn func(*sample)) {
	for b := range t.buckets {
		for k := range t.buckets[b] {
			fn(&t.buckets[b][k])
		}
	}
}

// fitLocked fits y = b + w·x by ridge regression over the samples whose
// y (from xy) is positive, on the first d features standardised (mean
// 0, variance 1; a constant column gets weight 0), with ridgePrior on
// each standardised weight; two passes, for accuracy, and a third for
// the residuals.
func (t *trainer) fitLocked(d int, xy func(*sample) ([maxFeatures]float64, float64)) linear {
	var mean [maxFeatures]float64
	var ymean float64
	n := 0
	t.eachLocked(func(s *sample) {
		x, y := xy(s)
		if y <= 0 {
			return
		}
		n++
		for j := range d {
			mean[j] += (x[j] - mean[j]) / float64(n)
		}
		ymean += (y - ymean) / float64(n)
	})
	if n == 0 {
		return linear{}
	}
	var a [maxFeatures][maxFeatures]float64
	var c [maxFeatures]float64
	t.eachLocked(func(s *sample) {
		x, y := xy(s)
		if y <= 0 {
			return
		}
		for j := range d {
			dj := x[j] - mean[j]
			c[j] += dj * (y - ymean)
			for k := range j + 1 {
				a[j][k] += dj * (x[k] - mean[k])
			}
		}
	})
	var sd [maxFeatures]float64 // each column's standard deviation; 0: constant
	for j := range d {
		sd[j] = math.Sqrt(a[j][j] / float64(n))
	}
	for j := range d {
		for k := range j + 1 {
			if sd[j] > 0 && sd[k] > 0 {
				a[j][k] /= sd[j] * sd[k]
			} else {
				a[j][k] = 0
			}
			a[k][j] = a[j][k]
		}
		if sd[j] > 0 {
			c[j] /= sd[j]
		}
		a[j][j] += ridgePrior
	}
	beta := solveSPD(&a, c, d)
	l := linear{n: n, b: ymean}
	for j := range d {
		if sd[j] > 0 {
			l.w[j] = beta[j] / sd[j]
			l.b -= l.w[j] * mean[j]
		}
	}
	var rss float64
	t.eachLocked(func(s *sample) {
		x, y := xy(s)
		if y > 0 {
			r := y - l.b
			for j := range d {
				r -= l.w[j] * x[j]
			}
			rss += r * r
		}
	})
	l.sigma = math.Sqrt(rss / float64(max(n-d-1, 1)))
	return l
}

// solveSPD solves a·x = c for the symmetric positive definite d×d
// matrix a (Cholesky; a is overwritten).
func solveSPD(a *[maxFeatures][maxFeatures]float64, c [maxFeatures]float64, d int) [maxFeatures]float64 {
	for j := range d {
		s := a[j][j]
		for k := range j {
			s -= a[j][k] * a[j][k]
		}
		a[j][j] = math.Sqrt(max(s, 1e-12))
		for i := j + 1; i < d; i++ {
			s := a[i][j]
			for k := range j {
				s -= a[i][k] * a[j][k]
			}
			a[i][j] = s / a[j][j]
		}
	}
	var y [maxFeatures]float64
	for i := range d {
		s := c[i]
		for k := range i {
			s -= a[i][k] * y[k]
		}
		y[i] = s / a[i][i]
	}
	for i := d - 1; i >= 0; i-- {
		s := y[i]
		for k := i + 1; k < d; k++ {
			s -= a[k][i] * y[k]
		}
		y[i] = s / a[i][i]
	}
	return y
}

package fleet

import (
	"math"
	"time"

	"github.com/kvrouter/kvrouter/route"
)

// Calibrator learns one correction factor of a replica's route.Rates from
// observed durations against predicted ones: Scale from times to first
// token, DecodeScale from inter-token latencies (see Ticket). It is the
// exponentially weighted mean, in log space, of observed / predicted.
// Working in log space makes over- and under-prediction by the same factor
// weigh the same, and the mean is a geometric mean.
//
// It is a small pure value with no clock and no lock, so the live fleet and
// the simulator use the same code. Its zero value is ready: Scale 1, the
// defaults below.
type Calibrator struct {
	// Alpha is the weight of each new observation once warmed up, 0..1;
	// zero means 0.1 (about the last 10 observations matter). The first
	// observations are averaged plainly (weight max(Alpha, 1/n)), so the
	// scale converges quickly from the preset.
	Alpha float64
	// Min and Max clamp both each observation's ratio and the learned
	// scale; zero means 1/1024 and 1024 (DefaultMinScale,
	// DefaultMaxScale).
	Min, Max float64
	// Jump clamps each observation's ratio, after the first, to within a
	// factor Jump of the current scale; zero means 4. The first
	// observation sets the scale wherever it lies in Min..Max; after that
	// one wild observation (a GC pause, a cold start) moves the scale by at
	// most a factor of Jump^Alpha (1.15 with the defaults), however wide
	// Min..Max, while a real change is followed at that pace.
	Jump float64
	// MinPredicted ignores observations whose prediction is shorter, since
	// their ratio is dominated by network and parsing time; zero means 1 ms.
	MinPredicted time.Duration

	logScale float64 // log of the current scale
	dev      float64 // weighted mean squared deviation of the log ratios
	n        int     // observations taken
}

// Observe records one request: predicted is the model's time to first token
// computed with Scale 1 (divide a scaled prediction by the scale it used),
// observed is the measured one. Non-positive or too short predictions and
// non-positive observations are ignored. It returns the new scale.
func (c *Calibrator) Observe(predicted, observed time.Duration) float64 {
	minPred := c.MinPredicted
	if minPred <= 0 {
		minPred = time.Millisecond
	}
	if predicted < minPred || observed <= 0 {
		return c.Scale()
	}
	lo, hi := c.bounds()
	ratio := min(max(float64(observed)/float64(predicted), lo), hi)
	if c.n > 0 {
		jump, cur := c.jump(), c.Scale()
		ratio = min(max(ratio, cur/jump), cur*jump)
	}
	c.n++
	w := max(c.alpha(), 1/float64(c.n))
	x, old := math.Log(ratio), c.logScale
	c.logScale = (1-w)*old + w*x
	c.dev = (1-w)*c.dev + w*(x-old)*(x-c.logScale)
	return c.Scale()
}

// Variance is the variance of the learned log scale as an estimate: the
// log ratios' spread times the weight the mean gives one of them (1/n
// while averaging plainly, Alpha/(2−Alpha) once exponential). Before two
// observations the spread is unknown and it is +Inf.
func (c *Calibrator) Variance() float64 {
	if c.n < 2 {
		return math.Inf(1)
	}
	a := c.alpha()
	w := a / (2 - a)
	if float64(c.n) < 1/a {
		w = 1 / float64(c.n)
	}
	return c.dev * float64(c.n) / float64(c.n-1) * w
}

// Spread is the spread of the observations about the learned scale: the
// standard deviation of log(observed / predicted), route.Rates.Spread
// (or DecodeSpread) for kv-aware's miss probabilities. The log ratios'
// weighted variance is pooled with route.PriorSpread's square, the prior
// weighing as one observation against at most one window (1/Alpha) of
// them, so that it gives way to what the replica shows as fast as the
// scale itself does. Before any observation it is 0: unknown, and
// kv-aware takes the prior.
func (c *Calibrator) Spread() float64 {
	if c.n == 0 {
		return 0
	}
	m := min(float64(c.n), 1/c.alpha())
	return math.Sqrt((route.PriorSpread*route.PriorSpread + m*c.dev) / (1 + m))
}

// Scale returns the learned observed/predicted factor, clamped to
// [Min, Max]; 1 before any observation.
func (c *Calibrator) Scale() float64 {
	lo, hi := c.bounds()
	return min(max(math.Exp(c.logScale), lo), hi)
}

// Observations returns how many observations were taken.
func (c *Calibrator) Observations() int { return c.n }

func (c *Calibrator) alpha() float64 {
	if c.Alpha > 0 && c.Alpha <= 1 {
		return c.Alpha
	}
	return 0.1
}

func (c *Calibrator) jump() float64 {
	if c.Jump > 1 {
		return c.Jump
	}
	return 4
}

// Defaults of Calibrator.Min and Max. The range is wide enough for
// emulated engines at any time scale in use (kvrouter engine --time-scale
// 0.05 is 20× faster than its preset, 0.001 a thousand times; a fast
// emulator's observed TTFT is mostly fixed HTTP and tokenizer time, so
// the learned scale lies above the time scale: about 0.25 at 0.05) and for
// a replica far slower than its preset (a larger model or older GPU
// behind the same preset, a CPU engine); Jump, not the range, bounds what
// one observation can do.
const (
	DefaultMinScale = 1.0 / 1024
	DefaultMaxScale = 1024
)

func (c *Calibrator) bounds() (lo, hi float64) {
	lo, hi = c.Min, c.Max
	if lo <= 0 {
		lo = DefaultMinScale
	}
	if hi <= 0 {
		hi = DefaultMaxScale
	}
	if hi < lo {
		hi = lo
	}
	return lo, hi
}

// CalibratedTTFT is the time to first token the policy predicted for the
// request, at the replica's learned Scale it priced with (PricedTTFT):
// what the observed TTFT is to be compared with (the dashboard's "TTFT
// pred / obs"). Zero when not predicted.
func (c Claim) CalibratedTTFT() time.Duration { return c.PricedTTFT }

// observeTTFT corrects the replica's Scale from a request that completed
// with usage u: its time to first token against the one predicted for
// the prefill the engine did (predictedTTFT). It runs at Done rather than
// at the first token because only the usage says what the engine had
// cached: Scale corrects how fast the replica computes, and a cache hit
// the index mispredicted is no measure of that (it is the residency
// model's error; taken as speed, a replica whose cache the approximate
// index over-predicts learns a Scale many times its own and is shunned).
//
// Only a request whose prediction is mostly compute says how fast the
// replica computes: of a near-full hit's few milliseconds, the compute is
// a sliver and the rest is what the model does not scale (the iteration
// it waits to join, a load from a CPU tier the router did not know of),
// and the ratio would put all of that on Scale: a replica that serves
// such requests learns a Scale of several times its own, prices every
// prefill at it and then serves only such requests, which keep it there
// (16 equal replicas on multi-tenant-context learned 1.1 and, five of
// them, 4.4 to 6.5; with a CPU tier all sixteen 10 to 20). So a request
// whose compute is under half its predicted time to first token is not
// observed. It reports whether it observed anything; r.mu is held.
func (t *Ticket) observeTTFTLocked(u Usage) bool {
	first := t.first.Load()
	if t.claim.PredictedTTFT <= 0 || first == 0 {
		return false
	}
	predicted, compute := t.predictedTTFT(u)
	if 2*compute < predicted {
		return false
	}
	t.r.cal.Observe(predicted, time.Duration(first-1))
	return true
}

// predictedTTFT is the claim's predicted time to first token at Scale 1
// with the engine's cached tokens, from its usage, in place of the
// predicted ones (both in the router's units of the prompt): the
// prediction's prefill compute swapped for that of the prefill the engine
// did; and that compute. Without cached tokens in the usage it is the
// prediction and its compute.
func (t *Ticket) predictedTTFT(u Usage) (predicted, compute time.Duration) {
	c := &t.claim
	if u.CachedTokens < 0 || u.PromptTokens <= 0 || c.PromptTokens <= 0 {
		return c.PredictedTTFT, t.prefill
	}
	cached := int(int64(min(u.CachedTokens, u.PromptTokens)) * int64(c.PromptTokens) / int64(u.PromptTokens))
	compute = t.f.preset.PrefillTime(c.PromptTokens-cached, cached)
	return max(c.PredictedTTFT-t.prefill+compute, 0), compute
}

// observeITL corrects the replica's DecodeScale from a streamed request
// that completed at now with usage u, batch being the replica's decode
// batch then, over its whole decode (observeDecodeLocked). Requests of
// fewer than 2 output tokens have no inter-token latency and are
// ignored. It reports whether it observed anything; r.mu is held.
func (t *Ticket) observeITLLocked(now time.Time, u Usage, batch int) bool {
	if u.CompletionTokens < 2 {
		return false
	}
	prompt := u.PromptTokens
	if prompt <= 0 {
		prompt = t.claim.PromptTokens
	}
	return t.observeDecodeLocked(&t.r.dcal, now, u.CompletionTokens-1, prompt, batch)
}

// observeDecodeLocked has c observe the decode of a streamed request from
// its first token to now, gaps inter-token gaps of a prompt of prompt
// tokens, batch being the replica's decode batch now: its observed span
// against the cost model's inter-token latency at DecodeScale 1 (a
// decode step, route.Rates.StepTime) times gaps. The batch it saw is the
// mean of the batches at its first token and now, and its sequences'
// context that many times its own mean context (prompt plus half its
// output so far): the router sees neither the engine's iterations nor
// the other sequences' lengths. The prefills that finished on the
// replica meanwhile (since work0) ran in the same iterations (chunked
// prefill) and lengthened them: their predicted time, at the replica's
// learned Scale, is taken off the observed span, so that DecodeScale
// corrects the decode side alone, whatever the load. Spans the
// Calibrator finds too short to measure (MinPredicted) are ignored. It
// reports whether it observed anything; r.mu is held.
func (t *Ticket) observeDecodeLocked(c *Calibrator, now time.Time, gaps, prompt, batch int) bool {
	first := t.first.Load()
	if first == 0 || gaps < 1 {
		return false
	}
	span := now.Sub(t.sent) - time.Duration(first-1)
	seqs := float64(t.batch0.Load()+int64(batch)) / 2
	ctx := seqs * (float64(prompt) + float64(gaps+1)/2)
	r := t.r
	others := time.Duration(r.prefilled.Load() - t.work0.Load())
	rt := r.rates.WithDefaults()
	predicted := rt.StepTime(seqs, ctx) * time.Duration(gaps)
	c.Observe(predicted, span-time.Duration(float64(others)*r.cal.Scale()))
	return true
}

// batch is r's decode batch at now as the router can tell: its own
// requests past their first token, or, when a scrape younger than
// freshLoad says the engine runs more than the router's own requests in
// prefill can explain (other clients share it), the engine's running
// count net of those.
func (r *replica) batch(now time.Time) int {
	own := int(r.decoding.Load())
	p := r.pub.Load()
	if !p.scraped || now.Sub(p.loadAt) > freshLoad {
		return own
	}
	prefilling := int(r.inFlight.Load()) - own
	return max(own, p.running-prefilling)
}

// freshLoad is the age up to which a scrape's running count is trusted
// for a decode batch: a few scrape intervals (100 ms by default).
const freshLoad = 500 * time.Millisecond

package fleet

import (
	"math"
	"time"

	"kvrouter/route"
)

// Calibrator learns a replica's route.Rates.Scale from observed times to
// first token: the exponentially weighted mean, in log space, of observed /
// predicted. Working in log space makes over- and under-prediction by the
// same factor weigh the same, and the mean is a geometric mean.
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
	// Min and Max clamp both each observation's ratio and the learned scale;
	// zero means 0.25 and 4. One wild TTFT (a GC pause, a cold start) moves
	// the scale by at most a factor of Max^Alpha.
	Min, Max float64
	// MinPredicted ignores observations whose prediction is shorter, since
	// their ratio is dominated by network and parsing time; zero means 1 ms.
	MinPredicted time.Duration

	logScale float64 // log of the current scale
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
	c.n++
	w := max(c.alpha(), 1/float64(c.n))
	c.logScale = (1-w)*c.logScale + w*math.Log(ratio)
	return c.Scale()
}

// Scale returns the learned observed/predicted factor, clamped to
// [Min, Max]; 1 before any observation.
func (c *Calibrator) Scale() float64 {
	lo, hi := c.bounds()
	return min(max(math.Exp(c.logScale), lo), hi)
}

// Observations returns how many observations were taken.
func (c *Calibrator) Observations() int { return c.n }

// Apply returns base with Scale set to the learned scale.
func (c *Calibrator) Apply(base route.Rates) route.Rates {
	base.Scale = c.Scale()
	return base
}

func (c *Calibrator) alpha() float64 {
	if c.Alpha > 0 && c.Alpha <= 1 {
		return c.Alpha
	}
	return 0.1
}

func (c *Calibrator) bounds() (lo, hi float64) {
	lo, hi = c.Min, c.Max
	if lo <= 0 {
		lo = 0.25
	}
	if hi <= 0 {
		hi = 4
	}
	if hi < lo {
		hi = lo
	}
	return lo, hi
}

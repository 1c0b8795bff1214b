package sim

import "time"

// calibrator corrects a replica's timing model from what the router
// observes: Rates.Scale is an exponentially weighted mean of observed TTFT
// over the model's unscaled prediction. The live router needs the same
// logic (there is no fleet package calibrator yet to share; this one is
// small enough to copy verbatim): ratios are clamped to [calMin, calMax]
// so one outlier (a preemption, a burst) cannot swing the model, and
// predictions under calFloor are ignored as too small to divide by.
type calibrator struct {
	scale float64 // current Rates.Scale; 1 until the first observation
	n     int     // observations so far
}

const (
	calAlpha = 0.05 // weight of a new observation
	calMin   = 0.25
	calMax   = 4
	calFloor = time.Millisecond
)

func newCalibrator() calibrator { return calibrator{scale: 1} }

// observe folds one request in: ttft as observed (routing to first token)
// and pred, the policy's prediction made with scale applied.
func (c *calibrator) observe(ttft, pred time.Duration, used float64) {
	if used <= 0 {
		used = 1
	}
	base := float64(pred) / used // the model's unscaled prediction
	if base < float64(calFloor) {
		return
	}
	ratio := min(max(float64(ttft)/base, calMin), calMax)
	c.n++
	a := calAlpha
	if c.n < 20 { // warm up faster: plain mean of the first observations
		a = 1 / float64(c.n)
	}
	c.scale += a * (ratio - c.scale)
}

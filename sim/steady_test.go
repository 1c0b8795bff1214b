package sim

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/report"
)

// TestSteadyRequests: ten turnovers of what Little's law says the fleet
// holds at the deciding run: 10 × load × knee × W, the largest over the
// policies; a search whose run is shorter is Short.
func TestSteadyRequests(t *testing.T) {
	o := &outcome{knee: 10, jobs: make([]job, 500)}
	var c report.Capacity
	o.steady(&c, []deciding{{load: 2, w: 3 * time.Second}, {load: 1.5, w: 500 * time.Millisecond}})
	if c.Requests != 500 || c.SteadyRequests != 600 || !c.Short() {
		t.Errorf("requests %d, steady %d, short %v; want 500, 10 × 2 × 10/s × 3 s = 600, short", c.Requests, c.SteadyRequests, c.Short())
	}
	if got := meanE2E([]report.Sample{{E2E: time.Second}, {E2E: 2 * time.Second}, {Rejected: true}}); got != time.Second {
		t.Errorf("mean time in the fleet %v, want 1s (a rejection spends none)", got)
	}
}

package route

import "time"

// SLO is a request's latency targets. A zero field sets no bound.
type SLO struct {
	// TTFT bounds the time to first token.
	TTFT time.Duration
	// ITL bounds the mean time between output tokens (TPOT): the decode
	// time divided by the output tokens after the first.
	ITL time.Duration
	// Class names the SLO's class (an API key's or a client's, or a
	// workload's class in the simulator) for metrics and records; empty
	// means the fleet's default. A constant string per class, so that
	// carrying it allocates nothing.
	Class string
}

// IsZero says the SLO sets no bound.
func (s SLO) IsZero() bool { return s.TTFT <= 0 && s.ITL <= 0 }

package sim

import (
	"time"
)

// sample is one finished request of one policy run.
type sample struct {
	job, rep               int32
	ttft, e2e, itl         time.Duration
	prompt, cached, output int
	predicted              int
	preempt, retries       int
}

// result is what one policy run produced.
type result struct {
	samples      []sample
	rejected     [3]int // by cause: policy, engine, killed
	rejectedJobs []int32
	reasons      map[string]int
	predicted    int64
	load         [][]int32 // per second, per replica in flight
	replicas     int
	finished     int
	end          time.Duration
}

// reason counts one decision reason.
func (s *result) reason(why string) {
	if s.reasons == nil {
		s.reasons = make(map[string]int)
	}
	s.reasons[why]++
}

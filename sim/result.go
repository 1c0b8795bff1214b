package sim

import (
	"time"

	"github.com/kvrouter/kvrouter/report"
)

// result is what one policy run produced.
type result struct {
	// samples holds one entry per request (served, rejected or failed),
	// in the order they ended.
	samples  []report.Sample
	replicas int // fleet size at the end (added replicas included)
	finished int // requests ended, for progress
	end      time.Duration
	// transfers and transferBytes count the KV imports the engines made,
	// and their size.
	transfers     int
	transferBytes int64
	// legs counts the prefill legs run (legs.go).
	legs int
	// learned is what the (first) router learned of each replica by the
	// end (report.Result.Learned).
	learned []report.Learned
	// noIndex is true when the policy reads no residency index, so it
	// predicts no cached tokens (report.Result.NoPrediction).
	noIndex bool
}

// Reject causes.
const (
	rejectPolicy = iota // the policy returned -1 (or a dead replica): Rejected
	rejectEngine        // the engine refused the request (too long): an error
	rejectKilled        // its replica was killed while it ran: an error
)

// counts returns how many samples are served, rejected and errors.
func (s *result) counts() (ok, rejected, errors int) {
	for i := range s.samples {
		switch {
		case s.samples[i].OK:
			ok++
		case s.samples[i].Rejected:
			rejected++
		default:
			errors++
		}
	}
	return ok, rejected, errors
}

package loadgen

import (
	"context"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/trace"
)

// TestBounds checks the closed loop completes every request, and that the
// run's duration stops an open loop whose arrivals run past it.
func TestBounds(t *testing.T) {
	reps := startReplicas(t, 1)
	spread := func(gap time.Duration) []trace.Request {
		var out []trace.Request
		for i := range 6 {
			out = append(out, trace.Request{ID: string(rune('a' + i)), At: time.Duration(i) * gap,
				Segments: []trace.Segment{{ID: uint64(i + 1), Tokens: 64}}, Prompt: 64, Output: 4})
		}
		return out
	}
	for _, tc := range []struct {
		name             string
		cfg              Config
		wantSent, wantOK int
	}{
		{"closed loop", Config{Requests: spread(time.Hour), Concurrency: 2}, 6, 6},
		{"duration", Config{Requests: spread(time.Second), Duration: 1500 * time.Millisecond}, 2, 2},
		{"max requests", Config{Requests: spread(0), MaxRequests: 3}, 3, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Target = reps[0].URL()
			res, err := Run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(res.Samples); got != tc.wantSent {
				t.Errorf("sent %d, want %d", got, tc.wantSent)
			}
			if got := res.Totals().OK; got != tc.wantOK {
				t.Errorf("completed %d, want %d (errors %v)", got, tc.wantOK, res.Totals().Errors)
			}
		})
	}
}

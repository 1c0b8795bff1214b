package fleet

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/route"
)

// TestLearnerTaughtThroughTickets: untrained, llm-d-predicted predicts
// 10 ms for every TTFT and TPOT, so a request with an SLO of 40 ms and
// 20 ms meets it; three streamed requests of TTFT 50 ms and TPOT 10 ms
// (10 output tokens, 90 ms after the first) go through Decide,
// FirstToken and Done, and once refitted it predicts exactly those
// (every feature constant, so the fit is the means): a request whose
// SLO they break is sure to miss it, one they meet sure not to.
func TestLearnerTaughtThroughTickets(t *testing.T) {
	f := newFleet(t, Config{Policy: &route.LLMDPredicted{MinSamples: 3, RetrainEvery: time.Second}})
	var sc Scratch
	req := func(i int, slo route.SLO) *Request {
		return &Request{ID: string(rune('a' + i)), Hash: uint64(i), Tokens: 64, MaxTokens: 10, TTFT: true, SLO: slo}
	}
	tight := route.SLO{TTFT: 40 * time.Millisecond, ITL: 20 * time.Millisecond}
	for i := range 3 {
		at := t0.Add(time.Duration(i) * time.Second)
		d, tk := f.Decide(req(i, tight), nil, at, &sc)
		if d.Reason != route.ReasonHeadroom || d.Miss != 0 {
			t.Errorf("request %d untrained: reason %q, miss %v; want %q, 0", i, d.Reason, d.Miss, route.ReasonHeadroom)
		}
		tk.FirstToken(at.Add(50 * time.Millisecond))
		tk.Done(at.Add(140*time.Millisecond), Usage{PromptTokens: 64, CachedTokens: 0, CompletionTokens: 10}, nil)
	}
	at := t0.Add(10 * time.Second)
	for _, tc := range []struct {
		name   string
		slo    route.SLO
		reason string
		miss   float64
	}{
		{"none", route.SLO{}, route.ReasonNoHeadroom, 0},
		{"ttft under 50ms", tight, route.ReasonNoHeadroom, 1},
		{"tpot under 10ms", route.SLO{TTFT: 100 * time.Millisecond, ITL: 9 * time.Millisecond}, route.ReasonNoHeadroom, 1},
		{"both met", route.SLO{TTFT: 60 * time.Millisecond, ITL: 11 * time.Millisecond}, route.ReasonHeadroom, 0},
	} {
		d, tk := f.Decide(req(9, tc.slo), nil, at, &sc)
		if d.Reason != tc.reason || d.Miss != tc.miss {
			t.Errorf("%s: reason %q, miss %v; want %q, %v", tc.name, d.Reason, d.Miss, tc.reason, tc.miss)
		}
		tk.Done(at, NoUsage, nil)
	}
}

package sim

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/trace"
)

// lone runs one request of prompt tokens and 2 output tokens on an idle
// engine and returns its TTFT and its one inter-token gap.
func lone(t *testing.T, c engine.Config, prompt int) (ttft, itl time.Duration) {
	t.Helper()
	e, err := engine.New(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Add(0, &engine.Request{ID: "x", Prompt: prompt, MaxTokens: 2}); err != nil {
		t.Fatal(err)
	}
	for now := time.Duration(0); now != engine.Idle; {
		evs, next := e.Step(now)
		for _, ev := range evs {
			if ev.Kind == engine.Done {
				return ev.First, ev.At - ev.First
			}
		}
		now = next
	}
	t.Fatal("the request never finished")
	return 0, 0
}

// TestDerivedSLO: with no SLO given, the goodput SLO's TTFT is what the
// 99th-percentile prompt of the requests the engine serves takes alone on
// an idle replica of the preset, as the engine itself times it, plus 4×
// the median prompt's; its ITL 5× one decode step at the median. An
// explicit bound is kept.
func TestDerivedSLO(t *testing.T) {
	preset, err := engine.Preset("qwen3-32b-2xh100")
	if err != nil {
		t.Fatal(err)
	}
	var reqs []trace.Request
	// Served prompts 100, 500, 3000, 8000: lower median 500. The
	// 50,000-token prompt exceeds the max model length (40,960): counted,
	// it would make the median 3,000.
	for i, p := range []int{3000, 100, 50_000, 8000, 500} {
		reqs = append(reqs, trace.Request{ID: string(rune('a' + i)), At: time.Duration(i) * time.Second, Prompt: p, Output: 8,
			Segments: []trace.Segment{{ID: uint64(i + 1), Tokens: p}}})
	}
	ttft, itl := lone(t, preset, 500)
	long, _ := lone(t, preset, 8000) // the 99th percentile of the four
	within := func(got, want time.Duration) bool {
		return got-want <= 100*time.Microsecond && want-got <= 100*time.Microsecond
	}
	tests := []struct {
		name      string
		given     SLO
		ttft, itl time.Duration
	}{
		{"derived", SLO{}, long + 4*ttft, 5 * itl},
		{"ttft given", SLO{TTFT: 2 * time.Second}, 2 * time.Second, 5 * itl},
		{"both given", SLO{TTFT: time.Second, ITL: 50 * time.Millisecond}, time.Second, 50 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run, err := Run(Config{Requests: reqs, Replicas: 2, Preset: preset, Policies: []string{"round-robin"}, SLO: tt.given})
			if err != nil {
				t.Fatal(err)
			}
			got := *run.SLO
			if !within(got.TTFT, tt.ttft) || !within(got.ITL, tt.itl) {
				t.Errorf("SLO TTFT %v, ITL %v; want %v, %v (within 100µs)", got.TTFT, got.ITL, tt.ttft, tt.itl)
			}
			for _, p := range run.Params {
				if p.Name == "slo_ttft" && p.Value != got.TTFT.String() {
					t.Errorf("param slo_ttft %s, want %v", p.Value, got.TTFT)
				}
			}
		})
	}
}

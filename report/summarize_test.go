package report

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

const ms = time.Millisecond

func TestPercentile(t *testing.T) {
	ten := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one value", []time.Duration{7}, 99, 7},
		{"p50 of ten is the 5th", ten, 50, 5},
		{"p90 of ten is the 9th", ten, 90, 9},
		{"p99 of ten is the 10th", ten, 99, 10},
		{"p100", ten, 100, 10},
		{"p1 of ten is the 1st", ten, 1, 1},
		{"p50 of four is the 2nd", []time.Duration{10, 20, 30, 40}, 50, 20},
		{"p51 of four is the 3rd", []time.Duration{10, 20, 30, 40}, 51, 30},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percentile(tt.sorted, tt.p); got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

// samples is a small literal run on 2 replicas: three completed requests,
// one rejected, one error.
func samples() []Sample {
	return []Sample{
		{At: 0, TTFT: 100 * ms, E2E: 1000 * ms, ITL: 50 * ms, Prompt: 1000, Cached: 500, PredictedCached: 600, Output: 19, Replica: 0, OK: true, Reason: "prefix"},
		{At: 0, TTFT: 300 * ms, E2E: 2000 * ms, ITL: 150 * ms, Prompt: 1000, Cached: 0, PredictedCached: 0, Output: 12, Replica: 1, OK: true, Reason: "least-loaded"},
		{At: 1000 * ms, TTFT: 3000 * ms, E2E: 3000 * ms, ITL: 0, Prompt: 2000, Cached: 1500, PredictedCached: 1000, Output: 1, Replica: 0, OK: true, Reason: "prefix"},
		{At: 1500 * ms, Replica: -1, Rejected: true, Prompt: 500, Reason: "no-healthy"},
		{At: 2000 * ms, TTFT: 0, E2E: 500 * ms, Prompt: 700, Replica: 1, Reason: "prefix"},
	}
}

func TestSummarize(t *testing.T) {
	got := Summarize(samples(), Options{Policy: "p", Buckets: 4})
	want := Result{
		Policy: "p", Requests: 5, Completed: 3, Rejected: 1, Errors: 1,
		TTFT:             Dist{P50: Millis(300 * ms), P90: Millis(3000 * ms), P99: Millis(3000 * ms), Mean: Millis(1133333333)},
		E2E:              Dist{P50: Millis(2000 * ms), P90: Millis(3000 * ms), P99: Millis(3000 * ms), Mean: Millis(2000 * ms)},
		ITL:              Dist{P50: Millis(50 * ms), P90: Millis(150 * ms), P99: Millis(150 * ms), Mean: Millis(100 * ms)},
		HitRate:          0.5,
		PredictedHitRate: 0.4,
		PromptTokens:     4000, CachedTokens: 2000, PrefillTokens: 2000, OutputTokens: 32,
		Duration:   Millis(4000 * ms),
		Throughput: 8,
		// Met: the first only (the second's ITL is 150 ms, the third's TTFT 3 s).
		Goodput: 0.25, SLOMet: 0.2,
		// Replica 0: [0,1s) and [1s,4s); replica 1: [0,2s) and [2s,2.5s).
		// Busiest: 1 over [0,4s) → 1; mean: (4+2.5)/2/4.
		MaxLoad: 1, MeanLoad: 6.5 / 8, PeakLoad: 1,
		Reasons:    map[string]int{"prefix": 3, "least-loaded": 1, "no-healthy": 1},
		PerReplica: []int{2, 2},
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(Result{}, "Series"), cmpopts.EquateApprox(0, 1e-9)); diff != "" {
		t.Errorf("Summarize (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]Point{{100, 1.0 / 3}, {300, 2.0 / 3}, {3000, 1}}, got.Series.TTFT, cmpopts.EquateApprox(0, 1e-6)); diff != "" {
		t.Errorf("TTFT CDF (-want +got):\n%s", diff)
	}
	wantLoad := [][]float64{{1, 1, 1, 1}, {1, 1, 0.5, 0}}
	if got.Series.Bucket != time.Second {
		t.Errorf("bucket: got %v, want 1s", got.Series.Bucket)
	}
	if diff := cmp.Diff(wantLoad, got.Series.Load); diff != "" {
		t.Errorf("load series (-want +got):\n%s", diff)
	}
}

func TestSummarizeEdges(t *testing.T) {
	empty := Summarize(nil, Options{Policy: "none"})
	if empty.Requests != 0 || empty.HitRate != 0 || empty.Throughput != 0 || empty.Series.Load != nil {
		t.Errorf("empty run: got %+v", empty)
	}
	// A fleet bigger than the replicas used keeps its idle replicas.
	one := Summarize(samples()[:1], Options{Replicas: 4})
	if diff := cmp.Diff([]int{1, 0, 0, 0}, one.PerReplica); diff != "" {
		t.Errorf("per replica (-want +got):\n%s", diff)
	}
	// A stricter SLO: nothing meets it.
	strict := Summarize(samples(), Options{SLO: SLO{TTFT: 50 * ms}})
	if strict.Goodput != 0 {
		t.Errorf("goodput under a 50 ms TTFT SLO: got %v, want 0", strict.Goodput)
	}
	// Many samples: the CDF has at most CDFPoints points, ending at the max.
	var many []Sample
	for i := range 1000 {
		many = append(many, Sample{At: time.Duration(i) * ms, TTFT: time.Duration(i+1) * ms, E2E: time.Duration(i+1) * ms, OK: true})
	}
	m := Summarize(many, Options{CDFPoints: 10})
	if n := len(m.Series.TTFT); n != 10 {
		t.Fatalf("got %d CDF points, want 10", n)
	}
	if last := m.Series.TTFT[9]; last != (Point{1000, 1}) {
		t.Errorf("last CDF point %+v, want {1000 1}", last)
	}
	if m.TTFT.P99 != Millis(990*ms) {
		t.Errorf("p99 of 1..1000 ms: got %v, want 990ms", m.TTFT.P99.D())
	}
}

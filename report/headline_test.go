package report

import (
	"testing"
)

func TestHeadline(t *testing.T) {
	ms := func(n float64) Millis { return Millis(n * 1e6) }
	rr := result("round-robin", 10, ms(400), ms(100), ms(900), 0.2)
	rr.NoPrediction = true
	shed := result("shed", 8, ms(50), ms(20), ms(500), 0.9)
	shed.Rejected = 2
	one := result("http://router", 10, ms(300), ms(100), ms(900), 0.5)
	one.PredictedHitRate = 0.45
	one.TTFT.P50 = ms(120)
	none := result("none", 0, 0, 0, 0, 0)
	tests := []struct {
		name string
		run  Run
		want string
	}{
		{"kv-aware wins", Run{Oracles: []Oracle{{OraclePooled, 0.8}}, Policies: []Result{
			rr, result("kv-aware", 10, ms(100), ms(40), ms(800), 0.7), result("b", 10, ms(150), ms(60), ms(700), 0.5),
		}}, "kv-aware won on TTFT p99: 100ms; the runner-up, b, took 1.50× as long (150ms), the last, round-robin, 4.00× (400ms). " +
			"Highest hit rate: kv-aware, 70.0% (pooled-cache oracle 80.0%); runner-up b, 50.0%."},
		{"kv-aware ranked", Run{Policies: []Result{
			result("a", 10, ms(100), ms(40), ms(800), 0.5), result("kv-aware", 10, ms(120), ms(40), ms(800), 0.6),
		}}, "a won on TTFT p99: 100ms; the runner-up, kv-aware, took 1.20× as long (120ms). " +
			"Highest hit rate: kv-aware, 60.0%; runner-up a, 50.0%. kv-aware ranked 2 of 2 on TTFT p99: 120ms, 1.20× the best."},
		{"tie", Run{Policies: []Result{
			result("a", 10, ms(100), ms(40), ms(800), 0.5), result("b", 10, ms(100), ms(40), ms(800), 0.5),
		}}, "a (tied with b) won on TTFT p99: 100ms, every policy the same. Highest hit rate: a, 50.0%."},
		{"shedding ranks last", Run{Policies: []Result{
			shed, result("a", 10, ms(100), ms(40), ms(800), 0.5), none,
		}}, "a won on TTFT p99: 100ms; the runner-up, shed, took 0.50× as long (50ms). " +
			"Highest hit rate: a, 50.0%; runner-up shed, 90.0%. Policies that rejected more requests rank after those that rejected fewer."},
		{"one policy", Run{Policies: []Result{one}}, "http://router: 10 of 10 requests completed; TTFT p50 120ms, p99 300ms; hit rate 50.0% (predicted 45.0%)."},
		{"one policy, no prediction", Run{Policies: []Result{rr}}, "round-robin: 10 of 10 requests completed; TTFT p50 0, p99 400ms; hit rate 20.0%."},
		{"nothing completed", Run{Policies: []Result{none}}, "No request completed under any policy."},
		{"no policy", Run{}, "No policy was run."},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Headline(&tt.run); got != tt.want {
				t.Errorf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}

func TestBoardHeadline(t *testing.T) {
	b := NewBoard(boardRuns(), "kv-aware")
	want := "TTFT p99: a won 2 of 2 cells; TTFT mean: kv-aware won 1 of 2 cells; end-to-end p99: a won 1 of 2 cells; hit rate: b won 2 of 2 cells. " +
		"kv-aware was within 3% of the best TTFT p99 in 2 of 2 cells."
	if got := boardHeadline(&b.Summary); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

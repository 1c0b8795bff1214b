package window

import (
	"testing"
	"time"
)

func TestSums(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	const span = 10 * time.Second
	var w Sums
	if a, b := w.Sum(t0, span); a != 0 || b != 0 {
		t.Fatalf("empty window: got %d %d, want 0 0", a, b)
	}
	w.Add(t0, span, 5, 1)
	w.Add(t0.Add(3*time.Second), span, 7, 1)
	w.Add(t0.Add(9*time.Second), span, 1, 0)
	tests := []struct {
		at   time.Duration
		a, b int64
	}{
		{0, 5, 1},
		{9 * time.Second, 13, 2},
		{10 * time.Second, 8, 1}, // the first bucket left
		{12*time.Second + 999*time.Millisecond, 8, 1},
		{13 * time.Second, 1, 0},
		{19 * time.Second, 0, 0},
		{time.Hour, 0, 0}, // a ring bucket reused long after is not counted
	}
	for _, tt := range tests {
		if a, b := w.Sum(t0.Add(tt.at), span); a != tt.a || b != tt.b {
			t.Errorf("at %v: got %d %d, want %d %d", tt.at, a, b, tt.a, tt.b)
		}
	}
	w.Add(t0.Add(time.Hour), span, 2, 2) // reuses a stale bucket
	if a, b := w.Sum(t0.Add(time.Hour), span); a != 2 || b != 2 {
		t.Errorf("after an hour: got %d %d, want 2 2", a, b)
	}
}

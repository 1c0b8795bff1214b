package route

import (
	"math"
	"testing"
)

func TestBusyAt(t *testing.T) {
	for _, maxSeqs := range []float64{1, 2, 255, 256, 257, 1 << 20, 1 << 52, 1<<52 + 2, 1 << 53, 1<<53 + 2, 1 << 60, 1 << 62, float64(math.MaxInt)} {
		n := busyAt(maxSeqs)
		full := func(n int) bool { return float64(n)-maxSeqs+1 > 0 }
		if !full(n) || n > math.MinInt && full(n-1) {
			t.Errorf("busyAt(%g) = %d: full(%d) = %v, full(%d) = %v; want the least n with a full batch",
				maxSeqs, n, n, full(n), n-1, full(n-1))
		}
	}
}

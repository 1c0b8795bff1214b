package proxy

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"kvrouter/route"
)

func TestPriorScale(t *testing.T) {
	tests := []struct {
		name string
		in   []float64
		want []float64
	}{
		{"none calibrated", []float64{1, 0, 1}, []float64{1, 0, 1}},
		{"all calibrated", []float64{0.5, 2}, []float64{0.5, 2}},
		{"geometric mean to the others", []float64{0.25, 1, 1, 0.5, 0}, []float64{0.25, 0.3536, 0.3536, 0.5, 0.3536}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var s route.Snapshot
			for _, sc := range tc.in {
				s.Replicas = append(s.Replicas, route.Replica{Rates: route.Rates{Scale: sc}})
			}
			priorScale(&s)
			got := make([]float64, len(s.Replicas))
			for i, r := range s.Replicas {
				got[i] = r.Rates.Scale
			}
			if d := cmp.Diff(tc.want, got, cmpopts.EquateApprox(0, 1e-3)); d != "" {
				t.Errorf("scales (-want +got):\n%s", d)
			}
		})
	}
}

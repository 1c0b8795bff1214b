package demo

import (
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/report"
)

// TestSkew: the reading explains a kv-aware run that piled requests on
// one replica, with its figures, and says nothing of a balanced one.
func TestSkew(t *testing.T) {
	tests := []struct {
		name    string
		per     []int
		reasons map[string]int
		want    string // "" means no clause
	}{
		{"idle replica", []int{165, 0, 44, 31}, map[string]int{"session": 200, "prefix": 30, "replicate": 10},
			"kv-aware put 69% of its requests on one replica and left 1 of 4 idle: " +
				"it sends a request where its prefix (a shared system prompt or document, then the session's history) is cached " +
				"unless its queue and batch there are predicted to cost the fleet more than prefilling the prompt elsewhere, " +
				`which it found for 10 of 240 requests (reason "replicate"). `},
		{"half on one", []int{30, 10, 10, 10}, map[string]int{"prefix": 60}, "kv-aware put 50% of its requests on one replica: "},
		{"balanced", []int{60, 60, 60, 60}, map[string]int{"prefix": 240}, ""},
		{"one replica", []int{60}, map[string]int{"prefix": 60}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &Result{Policies: []PolicyResult{
				{Policy: "round-robin", Report: report.Result{PerReplica: []int{240, 0, 0, 0}}},
				{Policy: "kv-aware", Report: report.Result{PerReplica: tt.per, Reasons: tt.reasons}},
			}}
			got := r.skew()
			if tt.want == "" && got != "" || !strings.HasPrefix(got, tt.want) {
				t.Errorf("got %q, want prefix %q", got, tt.want)
			}
		})
	}
}

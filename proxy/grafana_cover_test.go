package proxy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/internal/promtool"
)

// documentedMetrics returns the metrics docs/metrics.md lists (generated
// from the registries), with a histogram's _bucket, _sum and _count.
func documentedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(kvrouter_[a-z_]+)` \\| (\\w+) \\|").FindAllStringSubmatch(string(b), -1) {
		out[m[1]] = true
		if m[2] == "histogram" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				out[m[1]+s] = true
			}
		}
	}
	if len(out) < 50 {
		t.Fatalf("%d metrics in docs/metrics.md, want the router's (at least 50)", len(out))
	}
	return out
}

// TestGrafanaCoversEveryMetric: every metric the router, the KV-event
// subscriber, the shared state and the endpoint picker export
// (docs/metrics.md) is queried by some panel of the Grafana dashboard.
func TestGrafanaCoversEveryMetric(t *testing.T) {
	exprs, _ := dashboardQueries(t)
	queried := map[string]bool{}
	for _, es := range exprs {
		for _, e := range es {
			names, err := promqlMetrics(e)
			if err != nil {
				t.Fatalf("%q: %v", e, err)
			}
			for _, n := range names {
				queried[strings.TrimSuffix(n, "_bucket")] = true
			}
		}
	}
	for n := range documentedMetrics(t) {
		if strings.HasSuffix(n, "_bucket") || strings.HasSuffix(n, "_sum") || strings.HasSuffix(n, "_count") {
			continue
		}
		if !queried[n] {
			t.Errorf("%s is in no panel", n)
		}
	}
}

// TestGrafanaErrorRatioZero evaluates the "Error ratio" panel's query with
// promtool over traffic without errors (0, not "no data"), without
// traffic (0) and with 1 request in 4 failing (0.25; a client's errors
// do not count).
func TestGrafanaErrorRatioZero(t *testing.T) {
	exprs, _ := dashboardQueries(t)
	es := exprs["Error ratio"]
	if len(es) != 1 {
		t.Fatalf("Error ratio panel: %d queries, want 1", len(es))
	}
	tool := promtool.Path(t)
	expr := strings.NewReplacer(`$model`, `.*`, `$__rate_interval`, `5m`).Replace(es[0])
	q := strings.ReplaceAll(expr, `'`, `''`)
	// Each case: the requests' counters (ok, upstream_error, client_error
	// per minute) and the ratio wanted.
	cases := []struct {
		perMin [3]int
		want   string
	}{{[3]int{60, 0, 0}, "0"}, {[3]int{0, 0, 0}, "0"}, {[3]int{44, 16, 4}, "0.25"}}
	var b strings.Builder
	b.WriteString("rule_files: []\ntests:\n")
	for _, c := range cases {
		b.WriteString("- interval: 1m\n  input_series:\n")
		for k, o := range []string{`outcome="ok", code="200"`, `outcome="upstream_error", code="502"`, `outcome="client_error", code="400"`} {
			fmt.Fprintf(&b, "  - series: 'kvrouter_completion_requests_total{model=\"m\", %s}'\n    values: '0+%dx20'\n", o, c.perMin[k])
		}
		fmt.Fprintf(&b, "  promql_expr_test:\n  - expr: 'round(%s, 0.0001)'\n    eval_time: 10m\n    exp_samples: [{labels: '{}', value: %s}]\n", q, c.want)
	}
	tests := b.String()
	dir := t.TempDir()
	f := filepath.Join(dir, "ratio_test.yaml")
	if err := os.WriteFile(f, []byte(tests), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tool, "test", "rules", f).CombinedOutput(); err != nil {
		t.Errorf("promtool test rules over %s: %v\n%s", expr, err, out)
	}
}

package proxy

import (
	"fmt"
	"io"
	"net/http"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/sse"
	"github.com/kvrouter/kvrouter/view"
)

// families scrapes url's /metrics.
func families(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// total sums, over the samples of name whose labels include labels (name,
// value pairs), counter and gauge values and histogram sample counts.
func total(mfs map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	sum := 0.0
	for _, m := range mfs[name].GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		ok := true
		for i := 0; i+1 < len(labels); i += 2 {
			ok = ok && have[labels[i]] == labels[i+1]
		}
		if ok {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// labelValues lists the values label takes in name's samples, sorted.
func labelValues(mfs map[string]*dto.MetricFamily, name, label string) []string {
	var out []string
	for _, m := range mfs[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label && !slices.Contains(out, l.GetValue()) {
				out = append(out, l.GetValue())
			}
		}
	}
	slices.Sort(out)
	return out
}

// waitTotal polls url's /metrics until total(name, labels) is want.
func waitTotal(t *testing.T, url string, want float64, name string, labels ...string) {
	t.Helper()
	wait.For(t, fmt.Sprintf("%s%v = %v", name, labels, want), func() bool { return total(families(t, url), name, labels...) == want })
}

// TestRoutedCountedOnce: one streamed chat request and one pass-through
// call are one sample each in the routed histograms and counters and one
// in the pass-through ones, never the other's.
func TestRoutedCountedOnce(t *testing.T) {
	rt, url := errorRouter(t, nil)
	replica := rt.name(0)
	resp, body := do(t, "POST", url+chatPath, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}`)
	if resp.StatusCode != 200 || !strings.Contains(body, "[DONE]") {
		t.Fatalf("chat: %d %s", resp.StatusCode, body)
	}
	resp, body = do(t, "POST", url+"/tokenize", `{"model":"m","prompt":"hello"}`)
	if resp.StatusCode != 200 {
		t.Fatalf("tokenize: %d %s", resp.StatusCode, body)
	}
	waitTotal(t, url, 1, "kvrouter_passthrough_requests_total", "prefix", "/tokenize", "outcome", outcomeOK, "code", "200")
	waitTotal(t, url, 1, "kvrouter_completion_requests_total")
	mfs := families(t, url)
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"kvrouter_ttft_seconds", nil, 1},
		{"kvrouter_ttft_seconds", []string{"replica", replica, "model", "m"}, 1},
		{"kvrouter_e2e_seconds", nil, 1},
		{"kvrouter_e2e_seconds", []string{"replica", replica, "model", "m"}, 1},
		{"kvrouter_requests_total", nil, 1},
		{"kvrouter_completion_requests_total", []string{"endpoint", chatPath, "model", "m", "outcome", outcomeOK, "code", "200"}, 1},
		{"kvrouter_passthrough_requests_total", nil, 1},
		{"kvrouter_passthrough_duration_seconds", []string{"prefix", "/tokenize"}, 1},
	} {
		if got := total(mfs, tc.name, tc.labels...); got != tc.want {
			t.Errorf("%s%v = %v, want %v", tc.name, tc.labels, got, tc.want)
		}
	}
}

// TestUpstream500Counted: an engine's 500 is counted under
// outcome="upstream_error", code="500" and its model, and is no sample of
// the latency histograms (which hold requests answered ok).
func TestUpstream500Counted(t *testing.T) {
	rt, url := kvFullRouter(t)
	runRouter(t, rt)
	wait.For(t, "models listed", func() bool { return rt.View(time.Now()).Replicas[0].ModelsKnown })
	if resp, body := do(t, "POST", url+"/v1/completions", full500); resp.StatusCode != 500 {
		t.Fatalf("got %d %s, want 500", resp.StatusCode, body)
	}
	waitTotal(t, url, 1, "kvrouter_completion_requests_total",
		"endpoint", "/v1/completions", "model", "m", "outcome", outcomeUpstreamError, "code", "500")
	mfs := families(t, url)
	if got := total(mfs, "kvrouter_completion_requests_total"); got != 1 {
		t.Errorf("completion requests %v, want 1 (the held stream has not ended)", got)
	}
	if got := total(mfs, "kvrouter_e2e_seconds") + total(mfs, "kvrouter_ttft_seconds"); got != 0 {
		t.Errorf("latency samples %v, want 0", got)
	}
}

// TestModelLabelBounded: the model label takes the names the engine lists
// (its model and alias) and "other" for anything else: unknown names, a
// body with no model, a body that is not JSON; past maxModelLabels listed
// names, the rest are "other" too.
func TestModelLabelBounded(t *testing.T) {
	names := []string{"m", "m-alias"}
	for i := range maxModelLabels {
		names = append(names, fmt.Sprintf("alias-%02d", i))
	}
	e := modelEngine(t, names)
	rt, url := startRouter(t, "kv-aware", nil, e.URL())
	runRouter(t, rt)
	wait.For(t, "models listed", func() bool { return rt.View(time.Now()).Replicas[0].ModelsKnown })
	bodies := []string{`{"messages":[{"role":"user","content":"x"}]}`, `{"model":`}
	for i := range 5 {
		bodies = append(bodies, fmt.Sprintf(`{"model":"unknown-%d","messages":[{"role":"user","content":"x"}]}`, i))
	}
	for _, m := range []string{"m", "m-alias", names[len(names)-1]} { // the last is past the bound
		bodies = append(bodies, `{"model":"`+m+`","messages":[{"role":"user","content":"x"}],"max_tokens":1}`)
	}
	for _, b := range bodies {
		resp, err := http.Post(url+chatPath, "application/json", strings.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	waitTotal(t, url, float64(len(bodies)), "kvrouter_completion_requests_total")
	mfs := families(t, url)
	if got, want := labelValues(mfs, "kvrouter_completion_requests_total", "model"), []string{"m", "m-alias", otherModel}; !slices.Equal(got, want) {
		t.Errorf("model label values %v, want %v", got, want)
	}
	if got := total(mfs, "kvrouter_completion_requests_total", "model", otherModel); got != 8 {
		t.Errorf("model=other: %v, want 8 (5 unknown, no model, not JSON, past the bound)", got)
	}
	if got := total(mfs, "kvrouter_completion_requests_total", "model", "m", "outcome", outcomeOK); got != 1 {
		t.Errorf("model=m ok: %v, want 1", got)
	}
}

// TestBuildInfo: kvrouter_build_info is 1, labelled with the binary's
// module version and Go version.
func TestBuildInfo(t *testing.T) {
	_, url := startRouter(t, "round-robin", nil, "http://127.0.0.1:1")
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("no build info")
	}
	mfs := families(t, url)
	if got := total(mfs, "kvrouter_build_info", "version", bi.Main.Version, "goversion", runtime.Version()); got != 1 {
		t.Errorf("kvrouter_build_info{version=%q,goversion=%q} = %v, want 1; have %v", bi.Main.Version, runtime.Version(), got, mfs["kvrouter_build_info"])
	}
}

// TestMetricOutcome: how finished calls are classified.
func TestMetricOutcome(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    *call
		want string
	}{
		{"ok", &call{status: 200, outcome: view.OutcomeOK}, outcomeOK},
		{"engine 400", &call{status: 400, outcome: view.OutcomeOK}, outcomeClientError},
		{"router 400", &call{status: 400, errCode: "invalid_json", outcome: view.OutcomeError}, outcomeClientError},
		{"unknown model", &call{status: 404, errCode: codeModelNotFound, outcome: view.OutcomeError}, outcomeClientError},
		{"engine 500", &call{status: 500, outcome: view.OutcomeUpstreamError}, outcomeUpstreamError},
		{"unreachable", &call{status: 502, errCode: "upstream_unreachable", outcome: view.OutcomeError}, outcomeUpstreamError},
		{"engine 503", &call{status: 503, outcome: view.OutcomeUpstreamError}, outcomeUpstreamError},
		{"cut after 200", &call{status: 200, outcome: view.OutcomeUpstreamError, tapped: true, bufs: &bufs{tap: sse.Tap{Cut: true, CutCode: codeStreamCut}}}, outcomeUpstreamError},
		{"no healthy replica", &call{status: 503, errCode: codeNoHealthy, outcome: view.OutcomeError}, outcomeRejected},
		{"queue full", &call{status: 429, errCode: "queue_full", outcome: view.OutcomeError}, outcomeRejected},
		{"504", &call{status: 504, outcome: view.OutcomeUpstreamError}, outcomeTimeout},
		{"stalled stream", &call{status: 200, outcome: view.OutcomeUpstreamError, tapped: true, bufs: &bufs{tap: sse.Tap{Cut: true, CutCode: codeUpstreamTimeout}}}, outcomeTimeout},
		{"client gone", &call{status: 200, outcome: view.OutcomeCanceled}, outcomeCanceled},
	} {
		if got := tc.c.metricOutcome(); got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, got, tc.want)
		}
	}
}

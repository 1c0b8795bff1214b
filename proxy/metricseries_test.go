package proxy

import (
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrapeReplicaSeries scrapes admin's /metrics, fails t unless it is 200 and
// parses, and returns, for each per-replica gauge of the fleet collector,
// its samples by replica, counting repeats.
func scrapeReplicaSeries(t *testing.T, admin string) map[string]map[string][]float64 {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("/metrics: status %d: %s", resp.StatusCode, b)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	out := map[string]map[string][]float64{}
	for _, name := range []string{"kvrouter_inflight", "kvrouter_replica_healthy", "kvrouter_index_blocks"} {
		out[name] = map[string][]float64{}
		for _, m := range mfs[name].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "replica" {
					out[name][l.GetValue()] = append(out[name][l.GetValue()], m.GetGauge().GetValue())
				}
			}
		}
	}
	return out
}

// TestMetricsAfterReAdd: a backend removed while a stream on it runs and
// added again at once has a twin in the fleet (the removed slot, held by
// the stream, and the new one). /metrics stays 200 with one series per
// replica throughout: the twin's stream counts in the replica's in-flight
// gauge while it runs, and a replica removed for good has no series once
// its last stream ended. Before, the twins' equal labels made every scrape
// a 500 for good.
func TestMetricsAfterReAdd(t *testing.T) {
	reps := replicas(t, 2, 1)
	a, b := reps[0].URL(), reps[1].URL()
	rt, url, admin := serveLimited(t, nil, a, b)
	runRouter(t, rt)

	onB := streamOn(t, url, b)
	body := fmt.Sprintf(`{"url": %q}`, b)
	if resp, got := do(t, "DELETE", admin+pathBackends, body); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("remove with a stream in flight: %d %s, want 202", resp.StatusCode, got)
	}
	if resp, got := do(t, "POST", admin+pathBackends, body); resp.StatusCode != http.StatusCreated {
		t.Fatalf("re-add: %d %s, want 201", resp.StatusCode, got)
	}
	want := func(when string, inflightB []float64) {
		t.Helper()
		s := scrapeReplicaSeries(t, admin)
		for name, byReplica := range s {
			if len(byReplica[a]) != 1 || len(byReplica[b]) != 1 || len(byReplica) != 2 {
				t.Errorf("%s: %s has series %v, want one for a and one for b", when, name, byReplica)
			}
		}
		if got := s["kvrouter_inflight"][b]; fmt.Sprint(got) != fmt.Sprint(inflightB) {
			t.Errorf("%s: kvrouter_inflight{replica=b} = %v, want %v", when, got, inflightB)
		}
	}
	want("while the removed twin's stream runs", []float64{1})
	if !onB() {
		t.Error("the stream on the removed twin did not end with [DONE]")
	}
	want("after the twin's stream ended", []float64{0})

	// Removed for good with nothing in flight: no series for b.
	if resp, got := do(t, "DELETE", admin+pathBackends, body); resp.StatusCode != http.StatusOK {
		t.Fatalf("remove: %d %s, want 200", resp.StatusCode, got)
	}
	for name, byReplica := range scrapeReplicaSeries(t, admin) {
		if len(byReplica[b]) != 0 || len(byReplica[a]) != 1 {
			t.Errorf("after b's removal: %s has series %v, want a's alone", name, byReplica)
		}
	}
}

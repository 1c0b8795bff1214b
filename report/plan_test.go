package report

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestPlanTable: Compare counts the replicas saved against round-robin
// only where both were found, and the table marks a capacity still met
// at the ceiling (≥), none found (0) and a fleet past the search (>max).
func TestPlanTable(t *testing.T) {
	p := Plan{SLO: SLO{TTFT: 500 * time.Millisecond, ITL: 40 * time.Millisecond}, Attainment: 0.99, Replicas: 16,
		Rate: 12.5, Basis: BasisOwn, Source: "trace", RateScale: 2, MaxReplicas: 32, Tolerance: 0.02,
		Params: []Param{{"workload", "rec.jsonl"}, {"preset", "llama3-8b-h100"}},
		Policies: []PolicyPlan{
			{Policy: "kv-aware", Capacity: 64, Capped: true, Needed: 5, Binding: "ttft"},
			{Policy: "unique-loser", Capacity: 0, Needed: 0, Binding: "rejected"},
			{Policy: "round-robin", Capacity: 1.234567, Needed: 12, Binding: "itl"},
		}}
	p.Compare()
	if p.Policies[0].Saved == nil || *p.Policies[0].Saved != 7 || p.Policies[1].Saved != nil || *p.Policies[2].Saved != 0 {
		t.Fatalf("saved: got %v %v %v, want 7, none, 0", p.Policies[0].Saved, p.Policies[1].Saved, p.Policies[2].Saved)
	}
	var b bytes.Buffer
	if err := WritePlanTable(&b, &p); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	for _, want := range []string{
		"TTFT ≤ 500ms, mean ITL ≤ 40ms) met by 99% of requests, llama3-8b-h100; 1× = 12.5 req/s, the trace's own arrival rate",
		"replicas @2×",
		"kv-aware ≥64 5 +7 ttft",
		"unique-loser 0 >32 - rejected",
		"round-robin 1.23 12 +0 itl",
	} {
		if !strings.Contains(strings.Join(strings.Fields(got), " "), want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
	if v := p.Verdict("kv-aware"); !strings.Contains(v, "kv-aware needs 5 replicas for 2× this workload's traffic, round-robin 12") {
		t.Errorf("verdict: %s", v)
	}
}

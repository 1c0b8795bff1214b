package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runPlanArgs runs kvrouter plan with args, returning stdout, stderr and
// the error.
func runPlanArgs(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	errf, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer errf.Close()
	var out bytes.Buffer
	err = planCommand(context.Background(), args, &out, errf)
	stderr, _ := os.ReadFile(errf.Name())
	return out.String(), string(stderr), err
}

// planJSON is kvrouter plan --json, as much of it as the tests read.
type planJSON struct {
	Rate      float64 `json:"rate"`
	Basis     string  `json:"basis"`
	Load      float64 `json:"load"`
	Source    string  `json:"source"`
	RateScale float64 `json:"rate_scale"`
	Policies  []struct {
		Policy   string `json:"policy"`
		Capacity float64
		Needed   int  `json:"replicas_needed"`
		Saved    *int `json:"replicas_saved"`
		Binding  string
		Fleet    []struct {
			Replicas int     `json:"replicas"`
			Met      float64 `json:"met"`
		} `json:"fleet"`
	} `json:"policies"`
}

// writeTrace writes a small Mooncake trace: 160 requests 40 ms apart,
// in 8 groups sharing a 6-block prefix (512 tokens a block), each with a
// block of its own and a short answer.
func writeTrace(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for i := range 160 {
		g := i % 8
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [%d, %d, %d, %d, %d, %d, %d]}`+"\n",
			40*i, 6*512+100+i, 8+i%16, 100*g, 100*g+1, 100*g+2, 100*g+3, 100*g+4, 100*g+5, 10000+i)
	}
	path := filepath.Join(t.TempDir(), "recording.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestPlanTrace: kvrouter plan --trace sizes against the trace's own
// rate; each policy's capacity is exactly sim --capacity's rate scale at
// the 99% level on the same trace and fleet; a fleet of the replicas it
// needs met the level and one fewer, when run, did not; the replicas
// saved are round-robin's less its own; and the table says the same.
func TestPlanTrace(t *testing.T) {
	tr := writeTrace(t)
	args := []string{"--trace", tr, "--replicas", "2", "--policies", "kv-aware,round-robin", "--rate-scale", "2"}
	out, _, err := runPlanArgs(t, append(args, "--json")...)
	if err != nil {
		t.Fatal(err)
	}
	var p planJSON
	if err := json.Unmarshal([]byte(out), &p); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if p.Basis != "own" || p.Source != "trace" || p.RateScale != 2 || math.Abs(p.Rate-1/0.04) > 0.01 {
		t.Errorf("basis %q, source %q, rate scale %g, rate %g; want own, trace, 2, 25 req/s (a request every 40 ms)", p.Basis, p.Source, p.RateScale, p.Rate)
	}
	capOut, _, err := runSimArgs(t, "--capacity", "--trace", tr, "--replicas", "2", "--policies", "kv-aware,round-robin", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Policies []struct {
			At []struct {
				Level     float64 `json:"level"`
				RateScale float64 `json:"rate_scale"`
			} `json:"at"`
		} `json:"policies"`
	}
	if err := json.Unmarshal([]byte(capOut), &c); err != nil {
		t.Fatal(err)
	}
	rr := p.Policies[1]
	if p.Policies[0].Needed >= rr.Needed {
		t.Errorf("kv-aware needs %d replicas, round-robin %d; want fewer on a trace of shared prefixes", p.Policies[0].Needed, rr.Needed)
	}
	for i, q := range p.Policies {
		if at := c.Policies[i].At[0]; at.Level != 0.99 || q.Capacity != at.RateScale {
			t.Errorf("%s: plan capacity %g×, sim --capacity's at %g: %g×", q.Policy, q.Capacity, at.Level, at.RateScale)
		}
		met := map[int]float64{}
		for _, f := range q.Fleet {
			met[f.Replicas] = f.Met
		}
		if m, ok := met[q.Needed]; q.Needed == 0 || !ok || m < 0.99 {
			t.Errorf("%s: needs %d replicas, where %.3f met the SLO (run: %v); want a run meeting 99%%", q.Policy, q.Needed, m, ok)
		}
		if m, ok := met[q.Needed-1]; ok && m >= 0.99 {
			t.Errorf("%s: needs %d replicas, but %d met the SLO (%.3f)", q.Policy, q.Needed, q.Needed-1, m)
		}
		if q.Saved == nil || *q.Saved != rr.Needed-q.Needed {
			t.Errorf("%s: saved %v, want %d", q.Policy, q.Saved, rr.Needed-q.Needed)
		}
	}
	table, _, err := runPlanArgs(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"the trace's own arrival rate", "replicas @2×", "saved vs rr",
		fmt.Sprintf("kv-aware  %.3g  %d  %+d", p.Policies[0].Capacity, p.Policies[0].Needed, *p.Policies[0].Saved)} {
		if !strings.Contains(strings.Join(strings.Fields(table), "  "), strings.Join(strings.Fields(want), "  ")) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}

// TestPlanWorkloadReport: on a built-in workload 1× is sim's default load
// on the given fleet, said so in the table, and --report writes a page
// with both attainment charts and every policy.
func TestPlanWorkloadReport(t *testing.T) {
	html := filepath.Join(t.TempDir(), "plan.html")
	out, _, err := runPlanArgs(t, "--workload", "shared-prefix", "--requests", "120", "--replicas", "2", "--report", html)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "load 0.8 on 2 replicas") || !strings.Contains(out, "not the workload's own arrival rate") {
		t.Errorf("table does not say what 1× is:\n%s", out)
	}
	page, err := os.ReadFile(html)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range append([]string{"SLO attainment against traffic", "SLO attainment against replicas", `id="fleet-0"`, "kv-aware needs"},
		strings.Split(planPolicies, ",")...) {
		if !bytes.Contains(page, []byte(want)) {
			t.Errorf("report lacks %q", want)
		}
	}
}

// TestPlanBadFlags: values the search cannot take are usage errors that
// name the flag; an unknown policy, workload or missing trace is named.
func TestPlanBadFlags(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--attainment", "1.5"}, "--attainment 1.5: want a share"},
		{[]string{"--attainment", "0"}, "--attainment 0: want a share"},
		{[]string{"--rate-scale", "0"}, "--rate-scale 0: want a positive"},
		{[]string{"--replicas", "0"}, "--replicas 0: want at least 1"},
		{[]string{"--max-replicas", "-2"}, "--max-replicas -2"},
		{[]string{"--load", "-3"}, "--load -3: want a positive"},
		{[]string{"--tolerance", "0"}, "--tolerance 0"},
		{[]string{"--slo-ttft", "-1s"}, "must not be negative"},
		{[]string{"--preset", "nope"}, "nope"},
		{[]string{"--policies", "kv-aware,nope"}, `"nope"`},
		{[]string{"--workload", "nope"}, `unknown workload "nope"`},
		{[]string{"--trace", filepath.Join(t.TempDir(), "missing.jsonl")}, "missing.jsonl"},
		{[]string{"--replica", "4"}, "did you mean --replicas?"},
	}
	for _, c := range cases {
		_, _, err := runPlanArgs(t, append(c.args, "--requests", "20")...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("plan %s: error %v, want one containing %q", strings.Join(c.args, " "), err, c.want)
		}
	}
}

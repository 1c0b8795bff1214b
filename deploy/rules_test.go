package deploy

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/internal/promtool"

	"sigs.k8s.io/yaml"
)

// rulesFile is the PrometheusRule; rulesTests its promtool unit tests.
const (
	rulesFile  = "prometheusrule.yaml"
	rulesTests = "testdata/rules_test.yaml"
)

// readRules decodes the PrometheusRule strictly.
func readRules(t *testing.T) *prometheusRule {
	t.Helper()
	data, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(rulesFile, data)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 {
		t.Fatalf("%s: %d objects, want one PrometheusRule", rulesFile, len(objs))
	}
	pr, ok := objs[0].v.(*prometheusRule)
	if !ok {
		t.Fatalf("%s holds a %s, want a PrometheusRule", rulesFile, objs[0].kind)
	}
	return pr
}

// TestPrometheusRules: the PrometheusRule's groups, as a plain rules
// file, pass `promtool check rules` and the unit tests of
// testdata/rules_test.yaml (`promtool test rules`).
func TestPrometheusRules(t *testing.T) {
	pr := readRules(t)
	tool := promtool.Path(t)
	dir := t.TempDir()
	groups, err := json.Marshal(map[string]any{"groups": pr.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), groups, 0o644); err != nil { // JSON is YAML
		t.Fatal(err)
	}
	tests, err := os.ReadFile(rulesTests)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"check", "rules", "rules.yaml"}, {"test", "rules", "rules_test.yaml"}} {
		cmd := exec.Command(tool, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// TestRulesCovered: every alert has a unit test where it fires and one
// where it does not, every recording rule an expression test or an alert
// that reads it, and every metric a rule reads is one the router exports
// (docs/metrics.md, generated from the code) or Prometheus' own up.
func TestRulesCovered(t *testing.T) {
	pr := readRules(t)
	data, err := os.ReadFile(rulesTests)
	if err != nil {
		t.Fatal(err)
	}
	var ut struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `json:"alertname"`
				ExpAlerts []map[string]any `json:"exp_alerts"`
			} `json:"alert_rule_test"`
			PromqlExprTest []struct {
				Expr string `json:"expr"`
			} `json:"promql_expr_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(data, &ut); err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	var exprTests []string
	for _, tc := range ut.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
		for _, e := range tc.PromqlExprTest {
			exprTests = append(exprTests, e.Expr)
		}
	}
	docs, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	metric := regexp.MustCompile(`\bkvrouter_[a-z_]+`)
	records, alerts := map[string]bool{}, 0
	var exprs []string
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
			if r.Record != "" {
				records[r.Record] = true
				continue
			}
			alerts++
			if !fires[r.Alert] || !quiet[r.Alert] {
				t.Errorf("alert %s: a test where it fires %v, one where it does not %v; want both", r.Alert, fires[r.Alert], quiet[r.Alert])
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s: want a severity, a summary and a description", r.Alert)
			}
		}
	}
	for rec := range records {
		used := false
		for _, e := range append(exprs, exprTests...) {
			used = used || strings.Contains(e, rec)
		}
		if !used {
			t.Errorf("recording rule %s: neither tested nor read by an alert", rec)
		}
	}
	for _, e := range exprs {
		for _, m := range metric.FindAllString(e, -1) {
			base := m
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				base = strings.TrimSuffix(base, s)
			}
			if !strings.Contains(string(docs), "| `"+base+"` |") {
				t.Errorf("a rule reads %s, not in docs/metrics.md", m)
			}
		}
	}
	if alerts < 10 {
		t.Errorf("%d alerts, want the operator's set (at least 10)", alerts)
	}
}

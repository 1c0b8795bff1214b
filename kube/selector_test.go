package kube_test

import (
	"math/rand/v2"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/kvrouter/kvrouter/kube"
)

// TestParseSelectorGrammar is a table of Kubernetes' documented label
// selector grammar (Labels and Selectors, and the grammar in
// k8s.io/apimachinery/pkg/labels.Parse's comment): each selector is
// accepted or refused, and where accepted matches the label sets as the
// API server would. Every row is also checked against apimachinery's own
// parser, so the table cannot drift from Kubernetes.
func TestParseSelectorGrammar(t *testing.T) {
	vllm := map[string]string{"app.kubernetes.io/name": "vllm", "tier": "a"}
	canary := map[string]string{"app.kubernetes.io/name": "vllm", "tier": "b", "canary": "", "gen": "7"}
	other := map[string]string{"app": "sglang"}
	for _, tc := range []struct {
		sel   string
		ok    bool
		match string // of vllm, canary, other: "110" matches the first two; "" as Kubernetes does
	}{
		{"", true, "111"},
		{"app.kubernetes.io/name=vllm", true, "110"},
		{"app.kubernetes.io/name==vllm", true, "110"},
		{"app.kubernetes.io/name!=vllm", true, "001"},
		{"app.kubernetes.io/name = vllm , tier = a", true, "100"},
		{"tier in (a,b)", true, "110"},
		{"tier in (a, b)", true, "110"},
		{"tier notin (a)", true, "011"},
		{"tier", true, "110"},
		{"!tier", true, "001"},
		{"!canary,app.kubernetes.io/name=vllm", true, "100"},
		{"canary=", true, "010"},
		{"canary in ()", true, "010"},
		{"x in (foo,,baz),y,z notin ()", true, ""},
		{"tier in (in,notin)", true, ""},
		{"in=a", true, ""},
		{"gen>5", true, "010"},
		{"gen<5", true, "000"},
		{"example.com/a-b_c.d=v-1_2.3", true, ""},
		{"a=b,", false, ""},
		{",a=b", false, ""},
		{"a=b c", false, ""},
		{"tier in a", false, ""},
		{"tier in (a", false, ""},
		{"tier in (a b)", false, ""},
		{"tier notin", false, ""},
		{"!tier=a", false, ""},
		{"!!tier", false, ""},
		{"a!b", false, ""},
		{"a=!b", false, ""},
		{"a===b", false, ""},
		{"gen>x", false, ""},
		{"gen>-1", false, ""},
		{"/name=a", false, ""},
		{"Example.com/name=a", false, ""},
		{"a/b/c=d", false, ""},
		{"-a=b", false, ""},
		{"a=-b", false, ""},
		{strings.Repeat("k", 64) + "=v", false, ""},
		{"k=" + strings.Repeat("v", 64), false, ""},
		{strings.Repeat("k", 63) + "=" + strings.Repeat("v", 63), true, ""},
		{"a=b;c", false, ""},
	} {
		got, err := kube.ParseSelector(tc.sel)
		want, kerr := labels.Parse(tc.sel)
		if (err == nil) != tc.ok || (kerr == nil) != tc.ok {
			t.Errorf("ParseSelector(%q): err %v, Kubernetes %v; want ok %v", tc.sel, err, kerr, tc.ok)
			continue
		}
		if !tc.ok {
			continue
		}
		for i, set := range []map[string]string{vllm, canary, other} {
			in := want.Matches(labels.Set(set))
			if tc.match != "" {
				in = tc.match[i] == '1'
			}
			if got.Matches(set) != in || want.Matches(labels.Set(set)) != in {
				t.Errorf("%q on %v: matches %v, Kubernetes %v, want %v", tc.sel, set, got.Matches(set), want.Matches(labels.Set(set)), in)
			}
		}
	}
}

// TestParseSelectorAgreesWithKubernetes builds 20,000 selectors from the
// grammar's tokens, well-formed or not (a fixed seed), and checks that
// ParseSelector accepts exactly those apimachinery's labels.Parse accepts
// and that both match the same label sets.
func TestParseSelectorAgreesWithKubernetes(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 42))
	parts := []string{"a", "b", "tier", "app.kubernetes.io/name", "x.y/z", "in", "notin", "7", "-1", "",
		"=", "==", "!=", "!", "(", ")", ",", ">", "<", " ", " in ", " notin ", "/", "A", "_"}
	sets := []map[string]string{{}, {"a": "b"}, {"a": "", "tier": "7"}, {"app.kubernetes.io/name": "a", "x.y/z": "in"}, {"b": "notin", "a": "7"}}
	accepted := 0
	for range 20000 {
		var sb strings.Builder
		for range 1 + rng.IntN(8) {
			sb.WriteString(parts[rng.IntN(len(parts))])
		}
		s := sb.String()
		got, err := kube.ParseSelector(s)
		want, kerr := labels.Parse(s)
		if (err == nil) != (kerr == nil) {
			t.Fatalf("ParseSelector(%q): err %v; Kubernetes: %v", s, err, kerr)
		}
		if err != nil {
			continue
		}
		accepted++
		for _, set := range sets {
			if got.Matches(set) != want.Matches(labels.Set(set)) {
				t.Fatalf("%q on %v: matches %v, Kubernetes %v", s, set, got.Matches(set), want.Matches(labels.Set(set)))
			}
		}
	}
	if accepted < 1000 {
		t.Fatalf("only %d of 20000 selectors were well-formed: the generator tests too little", accepted)
	}
	t.Logf("%d of 20000 selectors accepted by both", accepted)
}

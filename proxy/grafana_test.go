package proxy

import (
	"encoding/json"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/internal/wait"
)

// dashboardFile is the Grafana dashboard over the router's metrics.
const dashboardFile = "../deploy/grafana/kvrouter.json"

// promqlWords are PromQL's keywords, aggregation operators and number
// literals: identifiers that are no metric name.
var promqlWords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true,
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true, "inf": true, "nan": true,
}

// labelListWords are the keywords followed by a parenthesised list of
// label names.
var labelListWords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// promqlMetrics returns the metric names an expression selects, in order
// of appearance, each once: identifiers outside strings, label matchers,
// range brackets and Grafana variables that are not functions (followed
// by "("), keywords, numbers or label lists; and the value of a
// __name__="..." matcher.
func promqlMetrics(expr string) ([]string, error) {
	var out []string
	add := func(n string) {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	nameMatcher := regexp.MustCompile(`__name__\s*=\s*"([^"]+)"`)
	s := expr
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			j, err := skipString(s, i)
			if err != nil {
				return nil, err
			}
			i = j
		case c == '{':
			j, err := skipUntil(s, i, '}')
			if err != nil {
				return nil, err
			}
			if m := nameMatcher.FindStringSubmatch(s[i:j]); m != nil {
				add(m[1])
			}
			i = j
		case c == '[':
			j, err := skipUntil(s, i, ']')
			if err != nil {
				return nil, err
			}
			i = j
		case c == '$': // a Grafana variable: $name or ${name}
			i++
			if i < len(s) && s[i] == '{' {
				j, err := skipUntil(s, i, '}')
				if err != nil {
					return nil, err
				}
				i = j
				continue
			}
			for i < len(s) && isIdent(s[i], true) {
				i++
			}
		case c >= '0' && c <= '9' || c == '.':
			for i < len(s) && (isIdent(s[i], true) || s[i] == '.' ||
				(s[i] == '+' || s[i] == '-') && (s[i-1] == 'e' || s[i-1] == 'E')) {
				i++
			}
		case isIdent(c, false):
			j := i
			for j < len(s) && isIdent(s[j], true) {
				j++
			}
			word := s[i:j]
			k := j
			for k < len(s) && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n') {
				k++
			}
			next := byte(0)
			if k < len(s) {
				next = s[k]
			}
			switch lw := strings.ToLower(word); {
			case labelListWords[lw] && next == '(':
				end, err := skipUntil(s, k, ')')
				if err != nil {
					return nil, err
				}
				j = end
			case promqlWords[lw], next == '(':
			default:
				add(word)
			}
			i = j
		default:
			i++
		}
	}
	return out, nil
}

// isIdent reports whether c may be in a PromQL identifier (at its start
// when rest is false).
func isIdent(c byte, rest bool) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || rest && c >= '0' && c <= '9'
}

// skipString returns the index past the string literal starting at s[i].
func skipString(s string, i int) (int, error) {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch {
		case s[j] == '\\' && q != '`':
			j++
		case s[j] == q:
			return j + 1, nil
		}
	}
	return 0, &json.SyntaxError{Offset: int64(i)}
}

// skipUntil returns the index past the close that ends the bracket at
// s[i], strings inside skipped, nested brackets of the same kind counted.
func skipUntil(s string, i int, close byte) (int, error) {
	open, depth := s[i], 0
	for j := i; j < len(s); j++ {
		switch c := s[j]; {
		case c == '"' || c == '\'' || c == '`':
			end, err := skipString(s, j)
			if err != nil {
				return 0, err
			}
			j = end - 1
		case c == open:
			depth++
		case c == close:
			if depth--; depth == 0 {
				return j + 1, nil
			}
		}
	}
	return 0, &json.SyntaxError{Offset: int64(i)}
}

func TestPromQLMetrics(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`kvrouter_inflight`, []string{"kvrouter_inflight"}},
		{`histogram_quantile(0.99, sum by (le, replica) (rate(kvrouter_ttft_seconds_bucket{model=~"$model", replica!="a{b}"}[$__rate_interval])))`, []string{"kvrouter_ttft_seconds_bucket"}},
		{`sum(rate(a_total[5m])) / clamp_min(sum(rate(b_total[5m] offset 1h)), 1e-9)`, []string{"a_total", "b_total"}},
		{`sum without (code) (x_total) > bool 0.5`, []string{"x_total"}},
		{`a and on(replica) b or ignoring (x, y) c unless d`, []string{"a", "b", "c", "d"}},
		{`a * on (replica) group_left(version) kvrouter_build_info`, []string{"a", "kvrouter_build_info"}},
		{`{__name__="foo", job="x"} + topk(3, bar) + count_values("v", baz)`, []string{"foo", "bar", "baz"}},
		{`label_replace(up, "dst", "$1", "src", "(.*)") + rate(y[5m:1m]) + ${var} + $other`, []string{"up", "y"}},
		{`sum by(le)(rate(kvrouter_decision_seconds_bucket[1m])) + Inf + NaN + 0x1F`, []string{"kvrouter_decision_seconds_bucket"}},
	} {
		got, err := promqlMetrics(tc.expr)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v %v, want %v", tc.expr, got, err, tc.want)
		}
	}
	for _, bad := range []string{`rate(x{a="b"[5m])`, `x{a="b}`, `rate(x[5m)`} {
		if got, err := promqlMetrics(bad); err == nil {
			t.Errorf("%s: got %v, want an error", bad, got)
		}
	}
}

// dashboardQueries reads the dashboard file and returns, per panel title,
// its targets' expressions, and the templating queries'
// label_values(metric, label) metric names.
func dashboardQueries(t *testing.T) (exprs map[string][]string, varMetrics []string) {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID        string
		Templating struct {
			List []struct {
				Name, Type string
				Query      json.RawMessage
			}
		}
		Panels []struct {
			ID         int
			Type       string
			Title      string
			Datasource struct{ UID string }
			Targets    []struct{ Expr string }
			Panels     []json.RawMessage // a collapsed row's
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if d.UID == "" {
		t.Error("dashboard has no uid")
	}
	exprs = map[string][]string{}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if len(p.Panels) > 0 {
			t.Errorf("row %q is collapsed: its panels would escape this check", p.Title)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %q, want ${datasource}", p.Title, p.Datasource.UID)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs[p.Title] = append(exprs[p.Title], tg.Expr)
		}
	}
	labelValues := regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*[a-zA-Z_]+\s*\)$`)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q); err != nil {
			json.Unmarshal(v.Query, &q.Query) // the older form: a string
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Errorf("variable %s: query %q, want label_values(metric, label)", v.Name, q.Query)
			continue
		}
		varMetrics = append(varMetrics, m[1])
	}
	return exprs, varMetrics
}

// TestGrafanaDashboard: every metric any panel or variable of
// deploy/grafana/kvrouter.json queries is in the /metrics of a real
// router (two emulated engines and one refusing connections, a
// pass-through path) after it served streamed and plain requests, a bad
// one and a pass-through call.
func TestGrafanaDashboard(t *testing.T) {
	exprs, varMetrics := dashboardQueries(t)
	if len(exprs) < 10 {
		t.Fatalf("%d panels with queries, want the dashboard's (at least 10)", len(exprs))
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	es := replicas(t, 2, 0.01)
	rt, url := startRouter(t, "round-robin", func(c *Config) { c.PassThrough = []string{"/tokenize"} }, es[0].URL(), dead, es[1].URL())
	for i := range 6 {
		stream := []string{"true", "false"}[i%2]
		resp, body := do(t, "POST", url+chatPath, `{"model":"m","messages":[{"role":"system","content":"`+words(7, 200)+`"},{"role":"user","content":"q"}],"max_tokens":3,"stream":`+stream+`}`)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	do(t, "POST", url+chatPath, `{"model":`)
	if resp, body := do(t, "POST", url+"/tokenize", `{"model":"m","prompt":"hi"}`); resp.StatusCode != 200 {
		t.Fatalf("tokenize: %d %s", resp.StatusCode, body)
	}
	waitTotal(t, url, 1, "kvrouter_passthrough_requests_total")
	wait.For(t, "the refusing replica ejected", func() bool { return !rt.st.healthy(1) })

	have := map[string]bool{}
	for name, mf := range families(t, url) {
		have[name] = true
		if mf.GetType().String() == "HISTOGRAM" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				have[name+s] = true
			}
		}
	}
	// What this router does not run (KV events, shared state, transfers,
	// the endpoint picker, reloads) or has not observed yet must be a
	// metric the code registers: docs/metrics.md, which TestGeneratedDocs
	// keeps equal to the registries.
	documented := documentedMetrics(t)
	queried, docOnly := 0, 0
	for title, es := range exprs {
		for _, e := range es {
			names, err := promqlMetrics(e)
			if err != nil || len(names) == 0 {
				t.Errorf("panel %q: %q: no metric name (%v)", title, e, err)
			}
			for _, n := range names {
				queried++
				switch {
				case have[n]:
				case documented[n]:
					docOnly++
				default:
					t.Errorf("panel %q queries %s, neither in /metrics nor in docs/metrics.md", title, n)
				}
			}
		}
	}
	for _, n := range varMetrics {
		if !have[n] {
			t.Errorf("variable queries %s, not in /metrics", n)
		}
	}
	if !t.Failed() {
		t.Logf("%d panels, %d metric references, all in /metrics but %d in docs/metrics.md", len(exprs), queried, docOnly)
	}
}

package report

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", path, diff)
	}
}

// testRun is a small literal run: two policies and two oracles.
func testRun() *Run {
	s := samples()
	other := samples()
	for i := range other {
		other[i].Cached /= 2
		other[i].Reason = "round-robin"
	}
	return &Run{
		Params:   []Param{{"workload", "shared-prefix"}, {"replicas", "2"}, {"seed", "1"}},
		Oracles:  []Oracle{{OracleInfinite, 0.8}, {OraclePooled, 0.625}},
		Policies: []Result{Summarize(s, Options{Policy: "kv-aware"}), Summarize(other, Options{Policy: "round-robin"})},
	}
}

func TestWriteJSON(t *testing.T) {
	var a, b bytes.Buffer
	if err := WriteJSON(&a, testRun()); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSON(&b, testRun()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two writes of the same run differ")
	}
	golden(t, "run.json", a.Bytes())
	var back struct {
		Policies []struct {
			Policy    string  `json:"policy"`
			PooledPct float64 `json:"pooled_pct"`
			TTFT      struct {
				P50 float64 `json:"p50"`
			} `json:"ttft_ms"`
		} `json:"policies"`
	}
	if err := json.Unmarshal(a.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if p := back.Policies[0]; p.Policy != "kv-aware" || p.PooledPct != 80 || p.TTFT.P50 != 300 {
		t.Errorf("got %+v, want kv-aware at 80%% of pooled with TTFT p50 300 ms", p)
	}
}

func TestWriteJSONNaN(t *testing.T) {
	run := &Run{Policies: []Result{{Policy: "x", HitRate: 0.0 / zero()}}}
	var b bytes.Buffer
	if err := WriteJSON(&b, run); err != nil {
		t.Fatalf("NaN hit rate: %v", err)
	}
}

func zero() float64 { return 0 }

func TestWriteTable(t *testing.T) {
	var b bytes.Buffer
	if err := WriteTable(&b, testRun()); err != nil {
		t.Fatal(err)
	}
	golden(t, "run.txt", b.Bytes())
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) != 5 {
		t.Fatalf("got %d lines, want header + 2 policies + 2 oracles", len(lines))
	}
	for _, l := range lines[1:] {
		if len(l) != len(lines[0]) {
			t.Errorf("row %q is %d wide, header %d: not aligned", l, len(l), len(lines[0]))
		}
	}
}

func TestDur(t *testing.T) {
	tests := []struct {
		in   time.Duration
		want string
	}{{0, "0"}, {1500 * time.Microsecond, "1.5ms"}, {850 * ms, "850ms"}, {1240 * ms, "1.24s"}, {250 * time.Second, "250s"}}
	for _, tt := range tests {
		if got := dur(Millis(tt.in)); got != tt.want {
			t.Errorf("dur(%v): got %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestWriteHTML(t *testing.T) {
	var b bytes.Buffer
	if err := WriteHTML(&b, testRun()); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, want := range []string{
		"<title>kvrouter simulation</title>",
		"shared-prefix",                         // a parameter
		"oracle pooled",                         // an oracle row
		`"policies":["kv-aware","round-robin"]`, // chart data
		"uPlot 1.6.32",                          // the inlined library
		"Leon Sorokin",                          // and its licence
		".uplot",                                // its stylesheet
		"least-loaded",                          // a decision reason
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(page, "ZgotmplZ") {
		t.Error("html/template rejected a value (ZgotmplZ)")
	}
	ext := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?\s*(https?:)?//`)
	if m := ext.FindString(page); m != "" {
		t.Errorf("page loads an external resource: %q", m)
	}
	if n := strings.Count(page, "<script"); n != 2 {
		t.Errorf("got %d script elements, want 2 (uPlot, charts)", n)
	}
	if len(page) > 120<<10 {
		t.Errorf("page is %d bytes, want it small (< 120 KiB)", len(page))
	}
	if *update {
		os.WriteFile(filepath.Join(os.TempDir(), "kvrouter-report.html"), b.Bytes(), 0o644)
	}
}

func TestProgress(t *testing.T) {
	var b bytes.Buffer
	t0 := time.Unix(0, 0)
	p := newProgress(&b, "sim", 100, t0)
	p.done = 10
	p.drawLocked(t0.Add(time.Second)) // before the delay: quiet
	if b.Len() != 0 {
		t.Fatalf("drew %q before the delay", b.String())
	}
	p.drawLocked(t0.Add(3 * time.Second))
	if !strings.Contains(b.String(), " 10% 10/100 3s, 27s left") {
		t.Errorf("got %q", b.String())
	}
	n := b.Len()
	p.drawLocked(t0.Add(3*time.Second + 50*time.Millisecond)) // rate-limited
	if b.Len() != n {
		t.Errorf("redrew within 100 ms")
	}
	p.Done()
	if !strings.HasSuffix(b.String(), "\r\x1b[2K") {
		t.Errorf("Done did not erase the bar")
	}
	var nilp *Progress
	nilp.Add(1) // a nil bar (stderr not a terminal) does nothing
	nilp.Done()
	f, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if NewProgress(f, "x", 1) != nil {
		t.Error("NewProgress on a plain file: want nil")
	}
}

// TestSLO: a run's SLO is written to JSON in milliseconds and above the
// table; a run without one writes neither.
func TestSLO(t *testing.T) {
	run := testRun()
	run.SLO = &SLO{TTFT: 526 * ms, ITL: 41900 * time.Microsecond}
	var j, tab bytes.Buffer
	if err := WriteJSON(&j, run); err != nil {
		t.Fatal(err)
	}
	if err := WriteTable(&tab, run); err != nil {
		t.Fatal(err)
	}
	if want := `"slo": {
    "ttft_ms": 526.000,
    "itl_ms": 41.900
  },`; !strings.Contains(j.String(), want) {
		t.Errorf("JSON lacks %s:\n%s", want, j.String())
	}
	if first, _, _ := strings.Cut(tab.String(), "\n"); first != "goodput SLO: TTFT ≤ 526ms, ITL ≤ 42ms" {
		t.Errorf("table's first line %q, want the SLO", first)
	}
	j.Reset()
	if err := WriteJSON(&j, testRun()); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(j.String(), `"slo"`) {
		t.Error("a run without an SLO writes one")
	}
}

package report

import (
	"bytes"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"
)

// capacityOf is a literal capacity search over workload: kv-aware capped
// at 8 at 99%, round-robin at 2 and 3, least-loaded at 2.04 (within 3%
// of round-robin) and 3.3.
func capacityOf(workload string) Capacity {
	curve := func(loads ...float64) []Attainment {
		var out []Attainment
		for i, l := range loads {
			out = append(out, Attainment{Load: l, Met: 1 - 0.05*float64(i), TTFTMissed: 0.05 * float64(i)})
		}
		return out
	}
	at := func(l99, l90 float64, capped bool) []LevelCapacity {
		return []LevelCapacity{{Level: 0.99, Load: l99, Rate: 10 * l99, Capped: capped}, {Level: 0.9, Load: l90, Rate: 10 * l90}}
	}
	return Capacity{Title: "kvrouter capacity: " + workload, Params: []Param{{"workload", workload}, {"load", "1"}, {"replicas", "2"}},
		SLO: SLO{TTFT: 500 * time.Millisecond, ITL: 40 * time.Millisecond}, KneeRate: 10, Tolerance: 0.02, Levels: []float64{0.99, 0.9},
		Policies: []PolicyCapacity{
			{Policy: "kv-aware", At: at(8, 8, true), Curve: curve(1, 2, 4, 8)},
			{Policy: "round-robin", At: at(2, 3, false), Binding: "ttft", Curve: curve(1, 2, 3, 4)},
			{Policy: "least-loaded", At: at(2.04, 3.3, false), Binding: "itl", Curve: curve(1, 2.04, 3.3, 4)},
		}}
}

func TestWriteCapacityHTML(t *testing.T) {
	page := checkPage(t, func(w io.Writer) error {
		return WriteCapacityHTML(w, []Capacity{capacityOf("shared-prefix"), capacityOf("agentic")})
	},
		"<title>kvrouter capacity</title>",
		"Highest capacity at the 99% SLO point: shared-prefix: kv-aware, load 8 (80 req/s), the runner-up least-loaded 0.26×; agentic:",
		"kv-aware was within 3% of the best on 2 of 2 workloads.",
		`id="capacity-1"`, `id="attain-0"`, `id="attain-1"`, // a section and a chart per workload
		"<h2>agentic: capacity at the SLO</h2>",
		"SLO: TTFT ≤ 500ms and mean ITL ≤ 40ms.",
		"<th>load@99%</th><th>req/s</th><th>× rr</th><th>load@90%</th>",
		"<td>kv-aware</td><td>≥8</td><td>80</td><td>4.00</td>", // capped, 4× round-robin's
		"<td>least-loaded</td><td>2.04</td><td>20.4</td><td>1.02</td><td>3.3</td><td>33</td><td>1.10</td><td>itl</td>",
		`"curves":[[[1,2,4,8],[1,0.95,0.9,0.85]]`, // the attainment curve as data
		`"levels":[0.99,0.9]`,
		"uPlot 1.6.32", "function attainChart", // inlined scripts
	)
	if strings.Contains(page, "<b>load</b>") {
		t.Error("the section lists the search's own load parameter")
	}
}

// checkPage writes a page with write and checks that it holds every one
// of wants, that html/template accepted every value and that it loads
// nothing from the network. It returns the page.
func checkPage(t *testing.T, write func(io.Writer) error, wants ...string) string {
	t.Helper()
	page := written(t, write)
	for _, want := range wants {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(page, "ZgotmplZ") {
		t.Error("html/template rejected a value (ZgotmplZ)")
	}
	if m := regexp.MustCompile(`(?i)(src|href)\s*=\s*["']?\s*(https?:)?//`).FindString(page); m != "" {
		t.Errorf("page loads an external resource: %q", m)
	}
	return page
}

// TestCapacityHeadlineDefaultBehind: when kv-aware is neither the best
// nor the runner-up, the verdict gives its ratio too.
func TestCapacityHeadlineDefaultBehind(t *testing.T) {
	c := capacityOf("unique")
	c.Policies[0].At[0].Load = 1
	got := capacityHeadline([]Capacity{c.normalized()}, "kv-aware")
	want := "Highest capacity at the 99% SLO point: unique: least-loaded, load 2.04 (20.4 req/s), the runner-up round-robin 0.98×, kv-aware 0.49×. kv-aware was within 3% of the best on 0 of 1 workloads."
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

// written is what write writes.
func written(t *testing.T, write func(io.Writer) error) string {
	t.Helper()
	var buf bytes.Buffer
	if err := write(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

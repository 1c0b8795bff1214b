package report

import (
	"bytes"
	"encoding/json"
	"io"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

// result is a literal policy result with the four ranked figures.
func result(policy string, completed int, ttftP99, ttftMean, e2eP99 Millis, hit float64) Result {
	return Result{Policy: policy, Requests: 10, Completed: completed, HitRate: hit,
		TTFT: Dist{P99: ttftP99, Mean: ttftMean}, E2E: Dist{P99: e2eP99}}
}

// boardRuns are two literal cells: in the first, a and kv-aware tie on
// TTFT p99 and "none" completed nothing; in the second kv-aware is within
// 3% on TTFT p99 and not on hit rate.
func boardRuns() []Run {
	ms := func(n float64) Millis { return Millis(n * 1e6) }
	params := func(w, l string) []Param { return []Param{{"workload", w}, {"load", l}, {"requests", "10"}} }
	return []Run{
		{Params: params("shared-prefix", "0.5"), Oracles: []Oracle{{OraclePooled, 0.8}}, Policies: []Result{
			result("a", 10, ms(100), ms(50), ms(1000), 0.5),
			result("kv-aware", 10, ms(100), ms(40), ms(2000), 0.6),
			result("none", 0, 0, 0, 0, 0),
			result("b", 10, ms(300), ms(60), ms(1500), 0.6),
		}},
		{Params: params("unique", "0.9"), Policies: []Result{
			result("a", 10, ms(100), ms(50), ms(1000), 0.5),
			result("kv-aware", 10, ms(102), ms(55), ms(1000), 0.4),
			result("b", 10, ms(200), ms(45), ms(900), 0.5),
		}},
	}
}

func TestNewBoard(t *testing.T) {
	b := NewBoard(boardRuns(), "kv-aware")
	s := b.Summary
	if len(b.Cells) != 2 || len(s.Cells) != 2 {
		t.Fatalf("got %d cells, %d summaries; want 2", len(b.Cells), len(s.Cells))
	}
	if diff := cmp.Diff([]string{"a", "kv-aware", "none", "b"}, s.Policies); diff != "" {
		t.Errorf("policies (-want +got):\n%s", diff)
	}
	c0 := s.Cells[0]
	if c0.Workload != "shared-prefix" || c0.Load != 0.5 {
		t.Errorf("cell 0 is %s @ %g, want shared-prefix @ 0.5", c0.Workload, c0.Load)
	}
	want := &Standing{Winner: "a", Tied: []string{"kv-aware"}, Best: 100, RunnerUp: "b",
		Ranks:  map[string]int{"a": 1, "kv-aware": 1, "b": 3},
		Ratios: map[string]float64{"a": 1, "kv-aware": 1, "b": 3}}
	if diff := cmp.Diff(want, c0.Metrics["ttft_p99"]); diff != "" {
		t.Errorf("cell 0 ttft p99 (-want +got):\n%s", diff)
	}
	want = &Standing{Winner: "kv-aware", Tied: []string{"b"}, Best: 0.6, RunnerUp: "a",
		Ranks:  map[string]int{"a": 3, "kv-aware": 1, "b": 1},
		Ratios: map[string]float64{"a": 0.833333, "kv-aware": 1, "b": 1}}
	if diff := cmp.Diff(want, c0.Metrics["hit_rate"]); diff != "" {
		t.Errorf("cell 0 hit rate (-want +got):\n%s", diff)
	}
	within := map[string]bool{"ttft_p99": true, "ttft_mean": false, "e2e_p99": false, "hit_rate": false}
	if diff := cmp.Diff(within, s.Cells[1].DefaultWithin); diff != "" {
		t.Errorf("cell 1: kv-aware within 3%% (-want +got):\n%s", diff)
	}
	wins := map[string]map[string]int{
		"ttft_p99":  {"a": 2, "kv-aware": 1, "none": 0, "b": 0},
		"ttft_mean": {"a": 0, "kv-aware": 1, "none": 0, "b": 1},
		"e2e_p99":   {"a": 1, "kv-aware": 0, "none": 0, "b": 1},
		"hit_rate":  {"a": 1, "kv-aware": 1, "none": 0, "b": 2},
	}
	if diff := cmp.Diff(wins, s.Wins); diff != "" {
		t.Errorf("wins (-want +got):\n%s", diff)
	}
}

func TestWriteBoardTable(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteBoardTable(&buf, NewBoard(boardRuns(), "kv-aware")); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"== shared-prefix @ 0.5 · 10 requests",
		"== unique @ 0.9",
		"== summary over 2 cells",
		"a (+1 tied)",
		"cells won, of 2",
		"kv-aware within 3% of the best",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`\n  unique @ 0\.9 +yes \(1\.02×\) +no \(1\.22×\)`).MatchString(out) {
		t.Errorf("no line says kv-aware is within 3%% on unique's TTFT p99 and not on its mean:\n%s", out)
	}
	checkWidth(t, out)
}

func TestWriteBoardHTML(t *testing.T) {
	checkPage(t, func(w io.Writer) error { return WriteBoardHTML(w, NewBoard(boardRuns(), "kv-aware")) },
		"<title>kvrouter leaderboard</title>",
		`id="cell-1"`, `id="cdf-1"`, `id="hit-0"`, // a section per cell
		"ttft p99 (lower is better)",        // a summary table
		"kv-aware within 3% of the best",    // and the default's
		`<td class="best">1.00×</td>`,       // a winner
		"uPlot 1.6.32", "function cdfChart", // inlined scripts
	)
}

// TestBoardSheddingRanksLast: a policy that rejected requests ranks after
// every policy that rejected fewer, however good the latencies of what it
// completed.
func TestBoardSheddingRanksLast(t *testing.T) {
	ms := func(n float64) Millis { return Millis(n * 1e6) }
	shed := result("shed", 8, ms(50), ms(20), ms(500), 0.9)
	shed.Rejected = 2
	run := Run{Params: []Param{{"workload", "unique"}, {"load", "2"}}, Policies: []Result{
		shed, result("a", 10, ms(100), ms(50), ms(1000), 0.5), result("b", 10, ms(200), ms(60), ms(900), 0.5),
	}}
	st := NewBoard([]Run{run}, "a").Summary.Cells[0].Metrics["ttft_p99"]
	want := &Standing{Winner: "a", Best: 100, RunnerUp: "b",
		Ranks:  map[string]int{"a": 1, "b": 2, "shed": 3},
		Ratios: map[string]float64{"a": 1, "b": 2, "shed": 0.5}}
	if diff := cmp.Diff(want, st); diff != "" {
		t.Errorf("ttft p99 (-want +got):\n%s", diff)
	}
}

// checkWidth checks that every line of out fits in 120 columns.
func checkWidth(t *testing.T, out string) {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(l); n > 120 {
			t.Errorf("line is %d columns, want ≤ 120: %q", n, l)
		}
	}
}

// capacityBoard is boardRuns' board with literal capacity searches on its
// two workloads; on "unique" kv-aware's 99% capacity is 1, half the best.
func capacityBoard() *Board {
	b := NewBoard(boardRuns(), "kv-aware")
	unique := capacityOf("unique")
	unique.Policies[0].At[0] = LevelCapacity{Level: 0.99, Load: 1, Rate: 10}
	b.AddCapacity([]Capacity{capacityOf("shared-prefix"), unique})
	return b
}

func TestBoardAddCapacity(t *testing.T) {
	b := capacityBoard()
	s := b.Summary.Capacity
	if s == nil || len(b.Capacity) != 2 || len(s.Workloads) != 2 {
		t.Fatalf("capacity summary %v, %d searches; want 2 workloads", s, len(b.Capacity))
	}
	if diff := cmp.Diff([]float64{0.99, 0.9}, s.Levels); diff != "" {
		t.Errorf("levels (-want +got):\n%s", diff)
	}
	want := &Standing{Winner: "least-loaded", Best: 2.04, RunnerUp: "round-robin",
		Ranks:  map[string]int{"least-loaded": 1, "round-robin": 2, "kv-aware": 3},
		Ratios: map[string]float64{"least-loaded": 1, "round-robin": 0.980392, "kv-aware": 0.490196}}
	if diff := cmp.Diff(want, s.Workloads[1].Levels[0]); diff != "" {
		t.Errorf("unique at 99%% (-want +got):\n%s", diff)
	}
	if w := s.Workloads[1]; w.Workload != "unique" || !cmp.Equal(w.DefaultWithin, []bool{false, true}) {
		t.Errorf("workload 1 is %s, kv-aware within 3%% %v; want unique, [false true]", w.Workload, w.DefaultWithin)
	}
	wins := []map[string]int{{"kv-aware": 1, "least-loaded": 1, "round-robin": 0}, {"kv-aware": 2, "least-loaded": 0, "round-robin": 0}}
	if diff := cmp.Diff(wins, s.Wins); diff != "" {
		t.Errorf("wins (-want +got):\n%s", diff)
	}
	if h := boardHeadline(&b.Summary); !strings.HasSuffix(h, " Capacity at 99%: kv-aware led 1 of 2 workloads. kv-aware's capacity was within 3% of the best on 1 of 2.") {
		t.Errorf("headline %q lacks the capacity clause", h)
	}
}

// TestBoardCapacityJSON: the board's JSON carries the searches and the
// capacity summary under their documented names, and a board without
// capacity has neither.
func TestBoardCapacityJSON(t *testing.T) {
	var got map[string]any
	if err := json.Unmarshal([]byte(written(t, func(w io.Writer) error { return WriteBoardJSON(w, capacityBoard()) })), &got); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]any{
		"capacity.1.title":                                        "kvrouter capacity: unique",
		"capacity.0.policies.0.curve.3.load":                      8.0,
		"summary.capacity.levels.1":                               0.9,
		"summary.capacity.policies.2":                             "least-loaded",
		"summary.capacity.workloads.1.workload":                   "unique",
		"summary.capacity.workloads.1.levels.0.winner":            "least-loaded",
		"summary.capacity.workloads.1.levels.0.best":              2.04,
		"summary.capacity.workloads.1.levels.0.ranks.kv-aware":    3.0,
		"summary.capacity.workloads.1.default_within_tolerance.0": false,
		"summary.capacity.wins.1.kv-aware":                        2.0,
	} {
		if v := lookup(got, path); v != want {
			t.Errorf("%s: got %v, want %v", path, v, want)
		}
	}
	if out := written(t, func(w io.Writer) error { return WriteBoardJSON(w, NewBoard(boardRuns(), "kv-aware")) }); strings.Contains(out, `"capacity"`) {
		t.Error("a board without capacity searches writes \"capacity\"")
	}
}

// lookup follows a dotted path of keys and indexes into decoded JSON.
func lookup(v any, path string) any {
	for _, k := range strings.Split(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			v = x[k]
		case []any:
			i, err := strconv.Atoi(k)
			if err != nil || i >= len(x) {
				return nil
			}
			v = x[i]
		default:
			return nil
		}
	}
	return v
}

func TestWriteBoardTableCapacity(t *testing.T) {
	out := written(t, func(w io.Writer) error { return WriteBoardTable(w, capacityBoard()) })
	for _, re := range []string{
		`== unique · capacity at the SLO \(TTFT ≤ 500ms, ITL ≤ 40ms\)`,
		`\n  policy +load@99% +req/s +× rr +# +load@90% +req/s +× rr +# +binds\n`,
		`\n  kv-aware +1 +10 +0\.50 +3 +8 +80 +2\.67 +1 +-\n`, // a rank per level
		`\ncapacity 99% \(load; higher is better\)\n`,
		`\n  unique +least-loaded +2\.04 +round-robin +0\.98× +0\.49× +3\n`,
		`\nworkloads won on capacity, of 2`,
		`\n  kv-aware +1 +2\n`,
		`\n  unique +no \(0\.49×\) +yes \(1\.00×\)\n`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("output lacks %s:\n%s", re, out)
		}
	}
	if i, j := strings.Index(out, "== unique · capacity"), strings.Index(out, "== summary"); i < 0 || i > j {
		t.Errorf("the capacity tables are not between the cells and the summary:\n%s", out)
	}
	checkWidth(t, out)
}

func TestWriteBoardHTMLCapacity(t *testing.T) {
	checkPage(t, func(w io.Writer) error { return WriteBoardHTML(w, capacityBoard()) },
		"Capacity at 99%: kv-aware led 1 of 2 workloads.",
		"<h3>capacity 99% (load; higher is better)</h3>",
		`<td>unique</td><td>2.04</td><td>0.49×</td><td>0.98×</td><td class="best">1.00×</td>`,
		"<td>workloads won</td><td></td><td>1</td>",
		"<h3>kv-aware&#39;s capacity within 3% of the best</h3>",
		`<td>unique</td><td>no 0.49×</td><td class="best">yes 1.00×</td>`,
		`id="capacity-1"`, `id="attain-1"`, "<h2>unique: capacity at the SLO</h2>",
		"<th>× rr</th><th>#</th>",
		`const CAPACITY = [{"policies":["kv-aware","round-robin","least-loaded"]`,
	)
	checkPage(t, func(w io.Writer) error { return WriteBoardHTML(w, NewBoard(boardRuns(), "kv-aware")) },
		"const CAPACITY = [];") // drawn over nothing, not over null
}

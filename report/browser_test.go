package report_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/internal/browser"
	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/sim"
	"github.com/kvrouter/kvrouter/trace"
)

var screenshot = flag.String("screenshot", "", "TestBrowserSimReport writes a PNG of the report to this path")

// simRun simulates every route policy plus kv-aware-precise (14 in all)
// on a small multi-turn-chat fleet: a real report of what the command
// writes.
func simRun(t *testing.T) *report.Run {
	t.Helper()
	w, err := trace.Generate("multi-turn-chat", trace.GenOptions{Seed: 1, Requests: 300})
	if err != nil {
		t.Fatal(err)
	}
	preset, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	run, err := sim.Run(sim.Config{Workload: w.Name, Requests: w.Requests, Replicas: 4, PresetName: "llama3-8b-h100",
		Preset: preset, Load: 0.8, Seed: 1, Policies: append(route.Names(), "kv-aware"+sim.PreciseSuffix)})
	if err != nil {
		t.Fatal(err)
	}
	return &run
}

// serve serves page at / for the test's life.
func serve(t *testing.T, page []byte) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write(page)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// open writes a page with write, serves it and opens it in a Chromium
// of 1500 × 1000 pixels; it returns the browser, its console and the
// page's first line (the verdict).
func open(t *testing.T, write func(io.Writer) error) (context.Context, *browser.Console, string) {
	t.Helper()
	var page bytes.Buffer
	if err := write(&page); err != nil {
		t.Fatal(err)
	}
	url := serve(t, page.Bytes())
	ctx, con := browser.Start(t, 1500, 1000)
	browser.Run(t, ctx, 20*time.Second, "navigate", chromedp.Navigate(url))
	verdict := browser.Run(t, ctx, 5*time.Second, "verdict", chromedp.Evaluate[string](`document.querySelector('header > p.verdict').textContent`))
	return ctx, con, verdict
}

// TestBrowserSimReport opens the HTML report of a 14-policy simulation in
// Chromium and checks what a reader sees: the first line is the verdict,
// naming the policy with the lowest TTFT p99 (checked against the
// figures); the CDF chart is drawn; every policy's hit-rate row has its
// own colour, kv-aware the reserved red, and no two labels overlap; a
// policy without an index shows a blank prediction; at 800 px the table
// scrolls sideways to its last column instead of being cut; and the page
// logs no console error.
func TestBrowserSimReport(t *testing.T) {
	run := simRun(t)
	ctx, con, verdict := open(t, func(w io.Writer) error { return report.WriteHTML(w, run) })
	if want := report.Headline(run); verdict != want {
		t.Errorf("first line %q, want the headline %q", verdict, want)
	}
	if first := browser.Run(t, ctx, 5*time.Second, "first line", chromedp.Evaluate[string](`document.querySelector('header h1').nextElementSibling.id`)); first != "verdict" {
		t.Errorf("the element after the title is #%s, want #verdict", first)
	}
	winner := bestP99(run)
	if !strings.HasPrefix(verdict, winner+" won on TTFT p99") {
		t.Errorf("first line %q does not name %s, the policy with the lowest TTFT p99, as the winner", verdict, winner)
	}

	// The CDF is drawn: uPlot made its canvas and one series per policy.
	series := browser.Run(t, ctx, 5*time.Second, "cdf", chromedp.Poll[int](`document.querySelector('#cdf canvas') && document.querySelectorAll('#cdf .u-legend .u-series').length`))
	if series != len(run.Policies)+1 {
		t.Errorf("CDF legend has %d series, want %d (x and one per policy)", series, len(run.Policies)+1)
	}

	type swatch struct {
		Name, Color                           string
		Left, Top, Right, Bottom, TrackHeight float64
		Pred                                  string
	}
	rows := browser.Run(t, ctx, 5*time.Second, "hit rows", chromedp.Evaluate[[]swatch](`[...document.querySelectorAll('#hit .hname')].map(n => {
		const r = n.getBoundingClientRect(), track = n.nextElementSibling, val = track.nextElementSibling;
		return {Name: n.textContent, Color: getComputedStyle(n.querySelector('i')).backgroundColor,
			Left: r.left, Top: r.top, Right: r.right, Bottom: r.bottom, TrackHeight: track.getBoundingClientRect().height,
			Pred: val.querySelector('small').textContent};
	})`))
	if len(rows) != len(run.Policies) {
		t.Fatalf("%d hit-rate rows, want %d", len(rows), len(run.Policies))
	}
	colors := map[string]string{}
	for i, r := range rows {
		if other, dup := colors[r.Color]; dup {
			t.Errorf("%s and %s share colour %s", other, r.Name, r.Color)
		}
		colors[r.Color] = r.Name
		if r.Name == "kv-aware" && r.Color != "rgb(214, 39, 40)" {
			t.Errorf("kv-aware is %s, want the reserved red rgb(214, 39, 40) (%s)", r.Color, report.KVAwareColor)
		}
		if r.Name != "kv-aware" && r.Color == "rgb(214, 39, 40)" {
			t.Errorf("%s has kv-aware's red", r.Name)
		}
		for _, q := range rows[:i] {
			if r.Left < q.Right && q.Left < r.Right && r.Top < q.Bottom && q.Top < r.Bottom {
				t.Errorf("labels %s and %s overlap", q.Name, r.Name)
			}
		}
		if r.TrackHeight <= 0 {
			t.Errorf("%s: hit-rate bar not drawn", r.Name)
		}
		if r.Name == "round-robin" && r.Pred != "no prediction" {
			t.Errorf("round-robin's prediction %q, want \"no prediction\" (it reads no index)", r.Pred)
		}
	}
	col := slices.Index([]string{"policy", "ttft p50", "p90", "p99", "mean", "e2e p50", "p99", "itl p50", "p99", "hit", "pred"}, "pred") + 1
	for _, p := range []struct{ name, want string }{{"round-robin", ""}, {"kv-aware", "pct"}} {
		cell := browser.Run(t, ctx, 5*time.Second, "pred cell", chromedp.Evaluate[string](fmt.Sprintf(
			`[...document.querySelectorAll('table tbody tr')].find(tr => tr.cells[0].textContent === %q).cells[%d].textContent`, p.name, col-1)))
		if p.want == "" && cell != "" || p.want == "pct" && !strings.HasSuffix(cell, "%") {
			t.Errorf("%s: pred cell %q, want %s", p.name, cell, map[string]string{"": "blank", "pct": "a percentage"}[p.want])
		}
	}

	// At 800 px the table scrolls sideways and its last column is reachable.
	browser.Run(t, ctx, 5*time.Second, "narrow", chromedp.EmulateViewport(800, 1000))
	reach := browser.Run(t, ctx, 5*time.Second, "scroll", chromedp.Evaluate[string](`(() => {
		const s = document.querySelector('section .scroll'), last = s.querySelector('thead th:last-child');
		if (s.scrollWidth <= s.clientWidth) return "not scrollable: " + s.scrollWidth + " <= " + s.clientWidth;
		s.scrollLeft = s.scrollWidth;
		const a = s.getBoundingClientRect(), b = last.getBoundingClientRect();
		return b.right <= a.right + 1 && b.left >= a.left ? "ok" : "last column at " + b.left + ".." + b.right + ", box " + a.left + ".." + a.right;
	})()`))
	if reach != "ok" {
		t.Errorf("narrow table: %s", reach)
	}
	if over := browser.Run(t, ctx, 5*time.Second, "page width", chromedp.Evaluate[int](`document.documentElement.scrollWidth - document.documentElement.clientWidth`)); over > 0 {
		t.Errorf("the page itself is %d px wider than the 800 px window; only the table should scroll", over)
	}
	if *screenshot != "" {
		browser.Run(t, ctx, 5*time.Second, "wide", chromedp.EmulateViewport(1500, 1000))
		time.Sleep(200 * time.Millisecond) // the relayout before the screenshot, which no event reports
		png := browser.Run(t, ctx, 10*time.Second, "screenshot", chromedp.FullScreenshot(100))
		if err := os.WriteFile(*screenshot, png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if errs := con.Errors(); len(errs) > 0 {
		t.Errorf("console errors:\n%s", strings.Join(errs, "\n"))
	}
}

// bestP99 is the policy with the lowest TTFT p99 among those that
// rejected the fewest requests (the leaderboard's ranking), first in run
// order on a tie.
func bestP99(run *report.Run) string {
	best := -1
	for i, p := range run.Policies {
		if p.Completed == 0 {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		b := run.Policies[best]
		if p.Rejected < b.Rejected || p.Rejected == b.Rejected && ms(p.TTFT.P99) < ms(b.TTFT.P99) {
			best = i
		}
	}
	return run.Policies[best].Policy
}

// ms rounds m to the microsecond, as the report compares figures.
func ms(m report.Millis) float64 { return float64(time.Duration(m).Round(time.Microsecond)) }

// TestBrowserBoardReport opens a two-cell leaderboard of the simulation,
// with a capacity search of its workload, in Chromium: its first line is
// the verdict over the cells and on capacity, each cell draws its CDF and
// its hit-rate bars, the workload its capacity table with ranks and its
// attainment chart, and the console stays clean.
func TestBrowserBoardReport(t *testing.T) {
	run := simRun(t)
	other := *run
	other.Params = slices.Clone(run.Params)
	for i := range other.Params {
		if other.Params[i].Name == "load" {
			other.Params[i].Value = "0.9" // the same figures under another name: a second cell
		}
	}
	b := report.NewBoard([]report.Run{*run, other}, "kv-aware")
	c := capacitySearch(t, "multi-turn-chat")
	b.AddCapacity([]report.Capacity{c})
	ctx, con, verdict := open(t, func(w io.Writer) error { return report.WriteBoardHTML(w, b) })
	winner := bestP99(run)
	if want := "TTFT p99: " + winner + " won 2 of 2 cells"; !strings.HasPrefix(verdict, want) {
		t.Errorf("first line %q, want it to start %q", verdict, want)
	}
	for i := range 2 {
		if n := browser.Run(t, ctx, 5*time.Second, "cell charts", chromedp.Poll[int](fmt.Sprintf(`document.querySelector('#cdf-%d canvas') && document.querySelectorAll('#hit-%d .hname').length`, i, i))); n != len(run.Policies) {
			t.Errorf("cell %d: %d hit-rate rows, want %d", i, n, len(run.Policies))
		}
	}
	want := fmt.Sprintf("Capacity at 99%%: %s led 1 of 1 workloads.", bestCapacity(&c))
	if !strings.Contains(verdict, want) {
		t.Errorf("first line %q lacks %q", verdict, want)
	}
	rows := browser.Run(t, ctx, 5*time.Second, "capacity table", chromedp.Evaluate[[]string](`[...document.querySelectorAll('#capacity-0 .scroll tbody tr')].map(tr => tr.cells[0].textContent + " " + tr.cells[4].textContent)`))
	if len(rows) != len(c.Policies) {
		t.Errorf("capacity table rows %q, want one per policy of %d, with its rank", rows, len(c.Policies))
	}
	series := browser.Run(t, ctx, 5*time.Second, "attainment chart", chromedp.Poll[int](`document.querySelector('#attain-0 canvas') && document.querySelectorAll('#attain-0 .u-legend .u-series').length`))
	if want := 1 + len(c.Policies) + len(c.Levels); series != want {
		t.Errorf("attainment chart has %d series, want %d (load, one per policy, one per level)", series, want)
	}
	if errs := con.Errors(); len(errs) > 0 {
		t.Errorf("console errors:\n%s", strings.Join(errs, "\n"))
	}
}

// capacitySearch searches the capacity of three policies on a small
// fleet (2 replicas, 48 requests) of workload: a real result of what
// kvrouter sim --capacity writes, in a fraction of a second.
func capacitySearch(t *testing.T, workload string) report.Capacity {
	t.Helper()
	preset, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	w, err := trace.Generate(workload, trace.GenOptions{Seed: 1, Requests: 48, FleetKVTokens: sim.FleetKVTokens(preset, 2)})
	if err != nil {
		t.Fatal(err)
	}
	c, err := sim.Capacity(sim.Config{Workload: w.Name, Requests: w.Requests, Replicas: 2, PresetName: "llama3-8b-h100",
		Preset: preset, Seed: 1, Policies: []string{"kv-aware", "least-loaded", "round-robin"}}, sim.CapacitySearch{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestBrowserCapacityReport opens the capacity page of two workloads in
// Chromium: its first line is the verdict, naming each workload's
// policy with the highest capacity at 99%; every workload has its table
// (one row per policy) and its attainment chart drawn, with one series
// per policy and a line per level; and the page logs no console error.
func TestBrowserCapacityReport(t *testing.T) {
	cs := []report.Capacity{capacitySearch(t, "shared-prefix"), capacitySearch(t, "agentic")}
	ctx, con, verdict := open(t, func(w io.Writer) error { return report.WriteCapacityHTML(w, cs) })
	for _, c := range cs {
		w, best := c.Params[0].Value, bestCapacity(&c)
		if want := fmt.Sprintf("%s: %s", w, best); !strings.Contains(verdict, want) {
			t.Errorf("first line %q does not say %q (the highest capacity at 99%%)", verdict, want)
		}
	}
	for i, c := range cs {
		rows := browser.Run(t, ctx, 5*time.Second, "table", chromedp.Evaluate[int](fmt.Sprintf(`document.querySelectorAll('#capacity-%d .scroll tbody tr').length`, i)))
		if rows != len(c.Policies) {
			t.Errorf("workload %d: %d table rows, want %d", i, rows, len(c.Policies))
		}
		type chart struct {
			Width, Height float64
			Series        []string
		}
		got := browser.Run(t, ctx, 5*time.Second, "attainment chart", chromedp.Poll[chart](fmt.Sprintf(`(() => {
			const el = document.getElementById('attain-%d'), cv = el.querySelector('canvas');
			if (!cv) return null;
			return {Width: cv.getBoundingClientRect().width, Height: cv.getBoundingClientRect().height,
				Series: [...el.querySelectorAll('.u-legend .u-series .u-label')].map(s => s.textContent)};
		})()`, i)))
		want := []string{"load"}
		for _, p := range c.Policies {
			want = append(want, p.Policy)
		}
		want = append(want, "99% level", "90% level")
		if strings.Join(got.Series, ",") != strings.Join(want, ",") {
			t.Errorf("workload %d: chart series %q, want %q", i, got.Series, want)
		}
		if got.Width < 300 || got.Height < 100 {
			t.Errorf("workload %d: chart canvas %.0f×%.0f px, want a drawn chart", i, got.Width, got.Height)
		}
	}
	if errs := con.Errors(); len(errs) > 0 {
		t.Errorf("console errors:\n%s", strings.Join(errs, "\n"))
	}
}

// bestCapacity is the first policy, in run order, with the highest
// capacity at c's first level.
func bestCapacity(c *report.Capacity) string {
	best := 0
	for i, p := range c.Policies {
		if p.At[0].Load > c.Policies[best].At[0].Load {
			best = i
		}
	}
	return c.Policies[best].Policy
}

// TestBrowserPlanReport opens kvrouter plan's page in Chromium: its first
// line is the verdict on kv-aware against round-robin with the replicas
// each needs; the table has a row per policy; both attainment charts are
// drawn, against traffic (log) and against replicas (linear), with one
// series per policy and the level; and the page logs no console error.
func TestBrowserPlanReport(t *testing.T) {
	preset, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	w, err := trace.Generate("shared-prefix", trace.GenOptions{Seed: 1, Requests: 48, FleetKVTokens: sim.FleetKVTokens(preset, 2)})
	if err != nil {
		t.Fatal(err)
	}
	p, err := sim.Plan(sim.Config{Workload: w.Name, Requests: w.Requests, Replicas: 2, PresetName: "llama3-8b-h100",
		Preset: preset, Seed: 1, Policies: []string{"kv-aware", "least-loaded", "round-robin"}}, sim.PlanSearch{Load: 0.8, MaxReplicas: 16})
	if err != nil {
		t.Fatal(err)
	}
	ctx, con, verdict := open(t, func(w io.Writer) error { return report.WritePlanHTML(w, []report.Plan{p}) })
	if want := fmt.Sprintf("kv-aware needs %d replicas", p.Policies[0].Needed); !strings.Contains(verdict, want) {
		t.Errorf("first line %q lacks %q", verdict, want)
	}
	if rows := browser.Run(t, ctx, 5*time.Second, "table", chromedp.Evaluate[int](`document.querySelectorAll('#plan-0 .scroll tbody tr').length`)); rows != len(p.Policies) {
		t.Errorf("%d table rows, want %d", rows, len(p.Policies))
	}
	for _, c := range []struct{ id, x string }{{"load-0", "traffic ×"}, {"fleet-0", "replicas"}} {
		got := browser.Run(t, ctx, 5*time.Second, c.id, chromedp.Poll[[]string](fmt.Sprintf(`(() => {
			const el = document.getElementById('%s');
			if (!el.querySelector('canvas')) return null;
			return [...el.querySelectorAll('.u-legend .u-series .u-label')].map(s => s.textContent);
		})()`, c.id)))
		want := []string{c.x, "kv-aware", "least-loaded", "round-robin", "99% level"}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%s: chart series %q, want %q", c.id, got, want)
		}
	}
	if errs := con.Errors(); len(errs) > 0 {
		t.Errorf("console errors:\n%s", strings.Join(errs, "\n"))
	}
}

// TestBrowserDemoReport opens, in Chromium at 1,280 × 900 pixels, the
// report of a run as the demo writes it (four policies, three of which
// predict nothing, no oracles, ranked by mean TTFT) and checks what a
// reader sees: the first line names the winner by the run's rule (the
// one report.Winner and the demo's terminal use); the table is whole,
// without a sideways scroll; no policy shows a prediction it does not
// make; nothing mentions an oracle the run does not have; and the TTFT
// chart's legend names every policy, with no placeholder value beside it
// until the cursor is on the chart.
func TestBrowserDemoReport(t *testing.T) {
	w, err := trace.Generate("multi-turn-chat", trace.GenOptions{Seed: 1, Requests: 200})
	if err != nil {
		t.Fatal(err)
	}
	preset, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	policies := []string{"round-robin", "least-loaded", "session-hash", "kv-aware"}
	run, err := sim.Run(sim.Config{Workload: w.Name, Requests: w.Requests, Replicas: 4, PresetName: "llama3-8b-h100",
		Preset: preset, Load: 0.8, Seed: 1, Policies: policies})
	if err != nil {
		t.Fatal(err)
	}
	run.Oracles, run.Rank = nil, "ttft_mean"
	ctx, con, verdict := open(t, func(w io.Writer) error { return report.WriteHTML(w, &run) })
	winner := report.Winner(&run).Winner
	if want := report.Headline(&run); verdict != want || !strings.HasPrefix(verdict, winner+" won on TTFT mean") {
		t.Errorf("first line %q, want the headline %q naming %s, the winner on TTFT mean", verdict, want, winner)
	}
	browser.Run(t, ctx, 5*time.Second, "1280", chromedp.EmulateViewport(1280, 900))
	fit := browser.Run(t, ctx, 5*time.Second, "table width", chromedp.Evaluate[string](`(() => {
		const s = document.querySelector('section .scroll');
		return s.scrollWidth <= s.clientWidth ? "ok" : "table " + s.scrollWidth + " px in a box of " + s.clientWidth;
	})()`))
	if fit != "ok" {
		t.Errorf("at 1,280 px the table is cut: %s", fit)
	}
	text := browser.Run(t, ctx, 5*time.Second, "text", chromedp.Evaluate[string](`document.body.innerText`))
	for _, bad := range []string{"pred 0.0%", "oracle"} {
		if strings.Contains(text, bad) {
			t.Errorf("the page shows %q, which this run does not have", bad)
		}
	}
	type entry struct{ Label, Value string }
	legend := browser.Run(t, ctx, 5*time.Second, "legend", chromedp.Poll[[]entry](`document.querySelector('#cdf canvas') &&
		[...document.querySelectorAll('#cdf .u-legend .u-series')].slice(1).map(s => ({Label: s.querySelector('.u-label').textContent, Value: s.querySelector('.u-value').textContent}))`))
	var labels []string
	for _, e := range legend {
		labels = append(labels, e.Label)
		if e.Value != "" {
			t.Errorf("legend %s reads %q with no cursor on the chart, want nothing", e.Label, e.Value)
		}
	}
	if !slices.Equal(labels, policies) {
		t.Errorf("legend %q, want the policies %q", labels, policies)
	}
	if errs := con.Errors(); len(errs) > 0 {
		t.Errorf("console errors:\n%s", strings.Join(errs, "\n"))
	}
}

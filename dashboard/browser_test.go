package dashboard

import (
	"context"
	"flag"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/browser"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/view"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
)

var (
	screenshot = flag.String("screenshot", "", "TestScreenshot writes a PNG of the page to this path (relative to dashboard/)")
	dark       = flag.Bool("dark", false, "TestScreenshot emulates prefers-color-scheme: dark")
)

// startBrowser starts Chromium at the window size of the screenshots.
func startBrowser(t *testing.T) (context.Context, *browser.Console) {
	return browser.Start(t, 1500, 900)
}

// within runs a with a timeout d.
func within[T any](t *testing.T, ctx context.Context, d time.Duration, what string, a chromedp.Action[T]) T {
	t.Helper()
	return browser.Run(t, ctx, d, what, a)
}

// text is the script reading the text of the first element matching sel.
func text(sel string) string {
	return `((document.querySelector(` + quote(sel) + `) || {}).textContent || "")`
}

func quote(s string) string { return "'" + s + "'" }

func TestBrowserShowsAndUpdates(t *testing.T) {
	src := sample()
	srv := httptest.NewServer(New(src))
	defer srv.Close()
	ctx, con := startBrowser(t)

	within(t, ctx, 20*time.Second, "navigate", chromedp.Navigate(srv.URL+"/ui?refresh=100"))
	rows := within(t, ctx, 10*time.Second, "replica rows",
		chromedp.Poll[int](`document.querySelectorAll('#replicas tbody tr[data-replica]').length === 3 && 3`))
	if rows != 3 {
		t.Fatalf("got %d replica rows, want 3", rows)
	}
	first := `#replicas tbody tr[data-replica="http://10.0.0.1:8000"] .inflight`
	if got := within(t, ctx, 5*time.Second, "in-flight cell", chromedp.Evaluate[string](text(first))); got != "3" {
		t.Errorf("in-flight cell %q, want 3", got)
	}

	// Traffic: more in flight and a new decision.
	src.update(func(f *view.Fleet, ds *[]view.Decision) {
		f.Replicas[0].InFlight = 17
		f.Replicas[0].Completed += 5
		*ds = append([]view.Decision{{
			ID: "kvr-1-3", At: t0, Session: "carol", Replica: "http://10.0.0.2:8000", Reason: "least-cost", TTFTWeight: 2,
			Candidates: []view.Candidate{
				{Replica: "http://10.0.0.1:8000", WaitMS: 50, PrefillMS: 10, TotalMS: 120},
				{Replica: "http://10.0.0.2:8000", WaitMS: 1, PrefillMS: 10, DecodeMS: 3.24, OthersMS: 0.24, TotalMS: 25.48},
				{Replica: "http://10.0.0.3:8000", WaitMS: 0, ImportMS: 4, PrefillMS: 10, MemoryMS: 100, MissesMS: 30, Miss: 0.25, TotalMS: 158},
			},
			PrunedCandidates: 919, PredictedCached: 0, ActualCached: -1, PromptTokens: -1, Outcome: "in-flight",
		}}, (*ds)...)
	})
	within(t, ctx, 5*time.Second, "in-flight update", chromedp.Poll[bool](text(first)+` === "17"`))
	within(t, ctx, 5*time.Second, "new decision", chromedp.Poll[bool](`!!document.querySelector('#decisions tr[data-id="kvr-1-3"]')`))

	// Expanding a decision shows its candidates, the chosen one marked, and
	// how many more were pruned.
	within(t, ctx, 5*time.Second, "expand", chromedp.Evaluate[chromedp.Void](`document.querySelector('#decisions tr[data-id="kvr-1-3"]').click()`))
	chosen := within(t, ctx, 5*time.Second, "candidates",
		chromedp.Poll[string](`document.querySelectorAll('tr.costs table.inner tbody tr').length === 3 && `+text(`tr.costs tr.chosen td`)))
	if chosen != "http://10.0.0.2:8000" {
		t.Errorf("chosen candidate %q, want http://10.0.0.2:8000", chosen)
	}
	if got := within(t, ctx, 5*time.Second, "pruned note", chromedp.Evaluate[string](`document.querySelector('tr.costs div.pruned').textContent`)); !strings.Contains(got, "919 more candidates pruned") {
		t.Errorf("pruned note %q, want 919 more candidates pruned", got)
	}
	// The chosen candidate's Total is written out as its sum, the TTFT
	// weight on screen, at decimals where the terms as written add up.
	arith := within(t, ctx, 5*time.Second, "arithmetic", chromedp.Evaluate[string](text(`tr.costs div.arith`)))
	if want := "http://10.0.0.2:8000: 2 × (1.00 + 0.00 + 0.00 + 10.00) + 3.24 + 0.24 + 0.00 + 0.00 + 0.00 = 25.48 ms"; arith != want {
		t.Errorf("arithmetic %q, want %q", arith, want)
	}
	if !addsUp(t, arith) {
		t.Errorf("arithmetic %q does not add up as written", arith)
	}
	if f := within(t, ctx, 5*time.Second, "formula", chromedp.Evaluate[string](text(`tr.costs div.formula`))); !strings.HasPrefix(f, "Total = 2 × (Wait + Import + Load + Prefill)") {
		t.Errorf("formula %q", f)
	}
	missing := within(t, ctx, 5*time.Second, "missing row", chromedp.Evaluate[string](`document.querySelectorAll('tr.costs table.inner tbody tr')[2].title`))
	if want := "http://10.0.0.3:8000: 2 × (0.0 + 4.0 + 0.0 + 10.0) + 0.0 + 0.0 + 100.0 + 0.0 + 30.0 = 158.0 ms"; missing != want || !addsUp(t, missing) {
		t.Errorf("the arithmetic of a candidate with misses %q, want %q", missing, want)
	}
	// The row stays open across refreshes (every 100 ms): staying open
	// through three is the behaviour under test.
	time.Sleep(300 * time.Millisecond)
	if n := within(t, ctx, 5*time.Second, "still open", chromedp.Evaluate[int](`document.querySelectorAll('tr.costs').length`)); n != 1 {
		t.Errorf("%d expanded rows after refreshes, want 1", n)
	}
	if errs := con.Errors(); len(errs) > 0 {
		t.Errorf("console errors:\n%v", errs)
	}
}

// addsUp parses "name: w × (a + b + c + d) + e + f + g + h + i = T ms"
// and reports whether the terms as written, rounded to the decimals they
// are written with, make T as written.
func addsUp(t *testing.T, s string) bool {
	t.Helper()
	m := regexp.MustCompile(`: ([0-9.]+) × \(([^)]*)\) \+ (.*?) = ([0-9.]+) ms$`).FindStringSubmatch(s)
	if m == nil {
		t.Errorf("arithmetic %q not in the expected form", s)
		return false
	}
	num := func(v string) float64 {
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			t.Errorf("term %q of %q: %v", v, s, err)
		}
		return f
	}
	sum := func(vs string) (total float64) {
		for _, v := range strings.Split(vs, " + ") {
			total += num(v)
		}
		return total
	}
	got := num(m[1])*sum(m[2]) + sum(m[3])
	dp := len(m[4]) - strings.Index(m[4], ".") - 1
	return strconv.FormatFloat(got, 'f', dp, 64) == m[4]
}

// TestBrowserReportsScriptErrors checks the console check itself: a page
// whose script throws must show up as an error.
func TestBrowserReportsScriptErrors(t *testing.T) {
	srv := httptest.NewServer(New(brokenSource{}))
	defer srv.Close()
	ctx, con := startBrowser(t)
	within(t, ctx, 20*time.Second, "navigate", chromedp.Navigate(srv.URL+"/ui?refresh=100"))
	within(t, ctx, 5*time.Second, "throw", chromedp.Evaluate[chromedp.Void](`setTimeout(() => { throw new Error("boom") }, 0); undefined`))
	wait.For(t, "a console error for the uncaught exception", func() bool { return len(con.Errors()) > 0 })
}

// brokenSource is an empty fleet.
type brokenSource struct{}

func (brokenSource) Fleet(now time.Time) view.Fleet  { return view.Fleet{At: now} }
func (brokenSource) Decisions(n int) []view.Decision { return nil }

// TestScreenshot writes a PNG of the page over the sample fleet, with one
// decision expanded and five minutes of time series from traffic whose
// rates vary (the handler's clock runs a second per read), when
// -screenshot is given:
//
//	go test -run TestScreenshot ./dashboard -args -screenshot=$PWD/dashboard.png [-dark]
func TestScreenshot(t *testing.T) {
	if *screenshot == "" {
		t.Skip("no -screenshot path")
	}
	src := sample()
	h := newHandler(&traffic{base: src, wave: true})
	clk := &tickingClock{at: t0, step: SeriesStep / 2}
	h.now = clk.now
	srv := httptest.NewServer(h.mux)
	defer srv.Close()
	ctx, _ := startBrowser(t)
	if *dark {
		within(t, ctx, 10*time.Second, "dark", chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			_, err := cdp.Call(ctx, t, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
				Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "dark"}},
			})
			return err
		}))
	}
	within(t, ctx, 20*time.Second, "navigate", chromedp.Navigate(srv.URL+"/ui?refresh=50"))
	within(t, ctx, 10*time.Second, "rows", chromedp.Poll[bool](`document.querySelectorAll('#replicas tbody tr[data-replica]').length > 0`))
	for i := range 40 { // a few samples for the sparklines
		src.update(func(f *view.Fleet, _ *[]view.Decision) {
			for j := range f.Replicas[:2] {
				f.Replicas[j].InFlight = 2 + (i*(j+3)+j*5)%7
			}
		})
		time.Sleep(100 * time.Millisecond) // the samples' spacing: two page refreshes each
	}
	within(t, ctx, 120*time.Second, "five minutes of samples", chromedp.Poll[bool](`/ 150 samples$/.test(document.getElementById('series-note').textContent)`, chromedp.WithPollingTimeout(120*time.Second)))
	within(t, ctx, 5*time.Second, "expand", chromedp.Evaluate[chromedp.Void](`document.querySelector('#decisions tr.decision').click()`))
	within(t, ctx, 5*time.Second, "expanded", chromedp.Poll[bool](`!!document.querySelector('tr.costs')`))
	png := within(t, ctx, 10*time.Second, "screenshot", chromedp.FullScreenshot(100))
	if err := os.WriteFile(*screenshot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (%d bytes)", *screenshot, len(png))
}

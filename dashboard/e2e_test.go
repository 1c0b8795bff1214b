package dashboard_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/internal/browser"
	"github.com/kvrouter/kvrouter/loadgen"
	"github.com/kvrouter/kvrouter/proxy"
	"github.com/kvrouter/kvrouter/trace"
)

// stack starts n emulated replicas publishing KV events and a kv-aware
// router in front of them in precise mode (token mode through the
// replicas' /tokenize), and serves the router's API and its admin surface,
// whose /ui is the dashboard. It returns the two URLs.
func stack(t *testing.T, n int) (api, admin string) {
	return stackOf(t, n, proxy.Remote)
}

// stackOf is stack with the router's tokenizer setting: proxy.Remote
// (token mode through the replicas' /tokenize, precise mode) or "" (text
// mode, the approximate index: the replicas publish no KV events).
func stackOf(t *testing.T, n int, tokenizer string) (api, admin string) {
	t.Helper()
	cfg := proxy.DefaultConfig()
	cfg.Policy = "kv-aware"
	cfg.Tokenizer = tokenizer
	cfg.ScrapeInterval = 100 * time.Millisecond
	cfg.HealthInterval = 100 * time.Millisecond
	for range n {
		s, err := emulator.Start(emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: 0.05,
			KVEventsEndpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*"}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		b := proxy.Backend{URL: s.URL(), KV: s.KVEventsEndpoint(), Replay: s.ReplayEndpoint()}
		if tokenizer == "" {
			b.KV, b.Replay = "", ""
		}
		cfg.Backends = append(cfg.Backends, b)
	}
	return serveRouter(t, cfg)
}

// serveRouter runs a router of cfg for the test's life and serves its API
// and its admin surface (whose /ui is the dashboard); it returns the two
// URLs.
func serveRouter(t *testing.T, cfg proxy.Config) (api, admin string) {
	t.Helper()
	rt, err := proxy.New(cfg, proxy.Deps{Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	srv := httptest.NewServer(rt.Handler())
	t.Cleanup(srv.Close)
	adm := httptest.NewServer(rt.AdminHandler())
	t.Cleanup(adm.Close)
	return srv.URL, adm.URL
}

// chat sends one chat completion in session and fails the test unless it
// succeeds.
func chat(t *testing.T, url, session, prompt string) { send(t, url, session, prompt, false) }

// send sends one chat completion in session, streamed or not, reads it to
// its end and fails the test unless it succeeds.
func send(t *testing.T, url, session, prompt string, stream bool) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{
		"model": "m", "max_tokens": 4, "stream": stream,
		"messages": []map[string]string{{"role": "system", "content": "You are terse."}, {"role": "user", "content": prompt}},
	})
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(string(b)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-ID", session)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Errorf("chat: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Errorf("chat: status %d", resp.StatusCode)
	}
}

func TestBrowserLiveRouter(t *testing.T) {
	const n = 3
	url, admin := stack(t, n)
	ctx, con := browser.Start(t, 1500, 900)
	run(t, ctx, 20*time.Second, "navigate", chromedp.Navigate(admin+"/ui?refresh=100"))
	rows := run(t, ctx, 10*time.Second, "replica rows",
		chromedp.Poll[int](fmt.Sprintf(`document.querySelectorAll('#replicas tbody tr[data-replica]').length === %d && %d`, n, n)))
	if rows != n {
		t.Fatalf("got %d replica rows, want %d", rows, n)
	}
	run(t, ctx, 10*time.Second, "healthy", chromedp.Poll[bool](`document.querySelectorAll('#replicas td.id .badge.up').length === 3`))
	// Every replica's KV-event stream is live: precise mode, no fallback.
	run(t, ctx, 10*time.Second, "live event streams", chromedp.Poll[bool](`document.querySelectorAll('#replicas td.events .badge.up').length === 3`))
	if got := run(t, ctx, 5*time.Second, "index tag", chromedp.Evaluate[string](`document.getElementById('index').textContent`)); got != "index: precise" {
		t.Errorf("index tag %q, want index: precise", got)
	}
	if got := run(t, ctx, 5*time.Second, "decisions card", chromedp.Evaluate[string](`document.querySelector('#decisions tbody').textContent`)); got != "no decisions yet" {
		t.Errorf("decisions before traffic %q, want no decisions yet", got)
	}

	var words strings.Builder
	for i := range 300 {
		fmt.Fprintf(&words, "w%d ", i)
	}
	for i := range 6 {
		chat(t, url, fmt.Sprintf("s%d", i%2), words.String()+fmt.Sprint(i))
	}
	// Completed counts and the decisions table follow the traffic.
	done := run(t, ctx, 10*time.Second, "completed",
		chromedp.Poll[int](`(() => { let s = 0; for (const c of document.querySelectorAll('#replicas td.completed')) s += parseInt(c.textContent); return s === 6 && s })()`))
	if done != 6 {
		t.Errorf("completed %d, want 6", done)
	}
	decisions := run(t, ctx, 10*time.Second, "decisions",
		chromedp.Poll[int](`document.querySelectorAll('#decisions tr.decision').length === 6 && 6`))
	if decisions != 6 {
		t.Errorf("%d decision rows, want 6", decisions)
	}
	// The engines reported cached tokens for the sessions' later turns: the
	// hit-rate card and the serving replicas' actual hit rates show them.
	hit := run(t, ctx, 10*time.Second, "hit rate",
		chromedp.Poll[string](`(() => { const v = [...document.querySelectorAll('#totals .card')].find(c => c.textContent.startsWith('Hit rate')).querySelector('.value').textContent; return /^[1-9][0-9.]*%$/.test(v) && v })()`))
	t.Logf("hit rate card %s", hit)
	hot := run(t, ctx, 5*time.Second, "replica hit rates",
		chromedp.Evaluate[int](`[...document.querySelectorAll('#replicas td.hit')].filter(c => /\/ [1-9][0-9.]*%$/.test(c.textContent)).length`))
	if hot < 1 {
		t.Errorf("%d replicas show a positive actual hit rate, want at least 1", hot)
	}
	run(t, ctx, 5*time.Second, "expand", chromedp.Evaluate[chromedp.Void](`document.querySelector('#decisions tr.decision').click()`))
	cands := run(t, ctx, 5*time.Second, "candidates", chromedp.Poll[int](`document.querySelectorAll('tr.costs table.inner tbody tr').length`))
	if cands != n {
		t.Errorf("%d candidates in the expanded decision, want %d", cands, n)
	}
	// The time series: sampled every 2 s while the page polls, so within a
	// few seconds of the traffic the rate, TTFT and hit-rate charts have
	// points, and every replica has its hit-rate chart.
	for _, id := range []string{"chart-rate", "chart-ttft", "chart-hit"} {
		run(t, ctx, 15*time.Second, id, chromedp.Poll[bool](`(() => { const s = document.querySelector('#`+id+` svg'); return !!s && +s.dataset.points > 0 })()`))
	}
	if got := run(t, ctx, 5*time.Second, "replica charts", chromedp.Evaluate[int](`document.querySelectorAll('#replica-hits .mini svg').length`)); got != n {
		t.Errorf("%d replica hit-rate charts, want %d", got, n)
	}
	// A replica drained through the admin API shows as draining.
	first := run(t, ctx, 5*time.Second, "first replica", chromedp.Evaluate[string](`document.querySelector('#replicas tr[data-replica]').dataset.replica`))
	resp, err := http.Post(admin+"/admin/v1/backends/drain", "application/json", strings.NewReader(`{"url": "`+first+`"}`))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("drain %s: %v %v", first, err, resp)
	}
	resp.Body.Close()
	drained := run(t, ctx, 10*time.Second, "draining badge",
		chromedp.Poll[string](`(() => { const b = [...document.querySelectorAll('#replicas td.id .badge.warn')].filter(b => b.textContent === 'draining'); return b.length === 1 && b[0].closest('tr').dataset.replica })()`))
	if drained != first {
		t.Errorf("draining badge on %q, want %q", drained, first)
	}
	if errs := con.Errors(); len(errs) > 0 {
		t.Errorf("console errors:\n%v", errs)
	}
}

// run runs a with a timeout derived from the browser's context.
func run[T any](t *testing.T, ctx context.Context, d time.Duration, what string, a chromedp.Action[T]) T {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	v, err := chromedp.Run(tctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// TestPredictedTTFTAgrees runs emulated engines at --time-scale 0.05 (20
// times faster than the llama3-8b-h100 preset the router's cost model
// starts from, which is told nothing of it) behind a real kv-aware router
// and checks what the dashboard shows: after a warm-up of 24 requests the
// predicted TTFT of each decision (at the replica's learned calibration
// scale) and the observed one agree within 30%, as the median and the
// geometric mean of observed/predicted over the next 60. The requests go
// one at a time (a loaded test machine's scheduling delays are then the
// only noise), with prompts of 1,500 to 4,000 words, every other one
// behind a shared 1,000-word system prompt, so that the predictions mix
// cached and uncached prefills.
func TestPredictedTTFTAgrees(t *testing.T) {
	const warm, measured = 24, 60
	url, admin := stackOf(t, 2, "")
	var shared strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&shared, "s%d ", i)
	}
	for k := range warm + measured {
		var p strings.Builder
		if k%2 == 0 {
			p.WriteString(shared.String())
		}
		for i := range 1500 + (k*977)%2500 {
			fmt.Fprintf(&p, "r%d-%d ", k, i)
		}
		send(t, url, "", p.String(), true)
	}
	var body struct {
		Decisions []struct {
			At        time.Time `json:"at"`
			Outcome   string    `json:"outcome"`
			Predicted float64   `json:"predicted_ttft_ms"`
			Observed  float64   `json:"ttft_ms"`
		} `json:"decisions"`
	}
	resp, err := http.Get(admin + "/ui/api/decisions?n=1000")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	ds := body.Decisions
	if len(ds) != warm+measured {
		t.Fatalf("%d decisions, want %d", len(ds), warm+measured)
	}
	slices.SortFunc(ds, func(a, b struct {
		At        time.Time `json:"at"`
		Outcome   string    `json:"outcome"`
		Predicted float64   `json:"predicted_ttft_ms"`
		Observed  float64   `json:"ttft_ms"`
	}) int {
		return a.At.Compare(b.At)
	})
	var ratios []float64
	logSum := 0.0
	for i, d := range ds {
		if d.Outcome != "ok" || d.Predicted <= 0 || d.Observed <= 0 {
			t.Errorf("decision %d: outcome %s, predicted %.3f ms, observed %.3f ms: want ok and both", i, d.Outcome, d.Predicted, d.Observed)
			continue
		}
		if i < warm {
			continue
		}
		q := d.Observed / d.Predicted
		ratios = append(ratios, q)
		logSum += math.Log(q)
	}
	if len(ratios) == 0 {
		t.Fatal("no decision after the warm-up")
	}
	slices.Sort(ratios)
	geo, median := math.Exp(logSum/float64(len(ratios))), ratios[len(ratios)/2]
	t.Logf("observed/predicted TTFT over %d requests after %d: geometric mean %.3f, median %.3f, range %.3f..%.3f",
		len(ratios), warm, geo, median, ratios[0], ratios[len(ratios)-1])
	for _, c := range []struct {
		name string
		q    float64
	}{{"geometric mean", geo}, {"median", median}} {
		if c.q < 1/1.3 || c.q > 1.3 {
			t.Errorf("%s of observed/predicted TTFT %.3f, want within 30%% of 1", c.name, c.q)
		}
	}
}

var (
	liveShot     = flag.String("live-screenshot", "", "TestLiveScreenshot writes a PNG of the dashboard over a live router to this path")
	liveDuration = flag.Duration("live-duration", 90*time.Second, "TestLiveScreenshot: how long traffic runs before the screenshot")
)

// TestLiveScreenshot runs the multi-turn-chat workload for -live-duration
// through a kv-aware router over three emulated replicas (precise mode,
// --time-scale 0.05) with the dashboard open, then writes a PNG of it,
// when -live-screenshot is given:
//
//	go test -run TestLiveScreenshot ./dashboard -args -live-screenshot=$PWD/live.png -live-duration=90s
func TestLiveScreenshot(t *testing.T) {
	if *liveShot == "" {
		t.Skip("no -live-screenshot path")
	}
	url, admin := stack(t, 3)
	ctx, con := browser.Start(t, 1500, 900)
	run(t, ctx, 20*time.Second, "navigate", chromedp.Navigate(admin+"/ui"))
	w, err := trace.Generate("multi-turn-chat", trace.GenOptions{Seed: 1, Requests: 100000})
	if err != nil {
		t.Fatal(err)
	}
	res, err := loadgen.Run(context.Background(), loadgen.Config{Target: url, Requests: w.Requests, Rate: 6, TimeScale: 0.05,
		Duration: *liveDuration, MaxTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	tot := res.Totals()
	t.Logf("%d requests, %d ok, hit rate %.3f, errors %v", tot.Requests, tot.OK, tot.HitRate(), tot.Errors)
	time.Sleep(3 * time.Second) // the last samples reach the page before the screenshot (a live demo run, not a check)
	run(t, ctx, 5*time.Second, "expand", chromedp.Evaluate[chromedp.Void](`document.querySelector('#decisions tr.decision').click()`))
	png := run(t, ctx, 10*time.Second, "screenshot", chromedp.FullScreenshot(100))
	if err := os.WriteFile(*liveShot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	if errs := con.Errors(); len(errs) > 0 {
		t.Errorf("console errors:\n%v", errs)
	}
}

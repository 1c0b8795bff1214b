package dashboard_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/dashboard"
	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/proxy"
)

// stack starts n emulated replicas publishing KV events and a kv-aware
// router in front of them in precise mode (token mode through the
// replicas' /tokenize), and serves the router's API and its admin surface,
// whose /ui is the dashboard. It returns the two URLs.
func stack(t *testing.T, n int) (api, admin string) {
	t.Helper()
	cfg := proxy.DefaultConfig()
	cfg.Policy = "kv-aware"
	cfg.Tokenizer = proxy.Remote
	cfg.ScrapeInterval = 100 * time.Millisecond
	cfg.HealthInterval = 100 * time.Millisecond
	for range n {
		s, err := emulator.Start(emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: 0.05,
			KVEventsEndpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*"}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		cfg.Backends = append(cfg.Backends, proxy.Backend{URL: s.URL(), KV: s.KVEventsEndpoint(), Replay: s.ReplayEndpoint()})
	}
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
func chat(t *testing.T, url, session, prompt string) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{
		"model": "m", "max_tokens": 4,
		"messages": []map[string]string{{"role": "system", "content": "You are terse."}, {"role": "user", "content": prompt}},
	})
	req, _ := http.NewRequest("POST", url+"/v1/chat/completions", strings.NewReader(string(b)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-ID", session)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat: status %d", resp.StatusCode)
	}
}

func TestBrowserLiveRouter(t *testing.T) {
	const n = 3
	url, admin := stack(t, n)
	ctx, con := dashboard.StartBrowser(t)
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

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

	"kvrouter/dashboard"
	"kvrouter/emulator"
	"kvrouter/proxy"
)

// routerSource adapts a proxy.Router to dashboard.Source. It is the
// adapter the proxy mounts the dashboard with (see the package report).
type routerSource struct{ rt *proxy.Router }

func (s routerSource) Fleet(now time.Time) dashboard.Fleet {
	v := s.rt.View(now)
	f := dashboard.Fleet{
		At: v.At, Policy: v.Policy, Index: v.Index, Sessions: v.Sessions, Decisions: v.Decisions,
		Replicas: make([]dashboard.Replica, len(v.Replicas)),
	}
	for i, r := range v.Replicas {
		f.Replicas[i] = dashboard.Replica{
			ID: r.ID, Healthy: r.Healthy,
			InFlight: r.InFlight, PrefillTokens: r.PrefillTokens, Decoding: r.Decoding, DecodeBlocks: r.DecodeBlocks,
			Running: r.Running, Waiting: r.Waiting, KVUsage: r.KVUsage, Scraped: r.Scraped, LoadAge: r.LoadAge,
			ScrapeErrors: r.ScrapeErrors, ScrapeError: r.ScrapeError,
			CacheBlocks: r.CacheBlocks, IndexBlocks: r.IndexBlocks, Sessions: r.Sessions,
			Completed: r.Completed, Failed: r.Failed,
			PredictedCached: r.PredictedCached, ActualCached: r.ActualCached,
			Scale: r.Scale, Horizon: r.Horizon,
		}
	}
	return f
}

func (s routerSource) Decisions(n int) []dashboard.Decision {
	recs := s.rt.Decisions(n)
	out := make([]dashboard.Decision, len(recs))
	for i, r := range recs {
		out[i] = dashboard.Decision{
			ID: r.ID, At: r.At, Session: r.Session, Policy: r.Policy, Model: r.Model,
			Tokens: r.Tokens, Blocks: r.Blocks, Replica: r.Replica, Reason: r.Reason, Failed: r.Failed,
			PredictedCached: r.PredictedCached, ActualCached: r.ActualCached, PromptTokens: r.PromptTokens,
			PredictedTTFTMS: r.PredictedTTFTMS, DecideMS: r.DecideMS, TTFTMS: r.TTFTMS, E2EMS: r.E2EMS,
			Status: r.Status, Outcome: r.Outcome,
			Candidates: make([]dashboard.Candidate, len(r.Candidates)),
		}
		for j, c := range r.Candidates {
			out[i].Candidates[j] = dashboard.Candidate(c)
		}
	}
	return out
}

// stack starts n emulated replicas and a kv-aware router in front, with
// the dashboard mounted as the proxy mounts it, and returns its URL.
func stack(t *testing.T, n int) string {
	t.Helper()
	cfg := proxy.DefaultConfig()
	cfg.Policy = "kv-aware"
	cfg.ScrapeInterval = 100 * time.Millisecond
	cfg.HealthInterval = 100 * time.Millisecond
	for range n {
		s, err := emulator.Start(emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: 0.05}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		cfg.Backends = append(cfg.Backends, proxy.Backend{URL: s.URL()})
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
	mux := http.NewServeMux()
	mux.Handle("/ui/", dashboard.New(routerSource{rt}))
	mux.Handle("/", rt.Handler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
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
	url := stack(t, n)
	ctx, con := dashboard.StartBrowser(t)
	run(t, ctx, 20*time.Second, "navigate", chromedp.Navigate(url+"/ui?refresh=100"))
	rows := run(t, ctx, 10*time.Second, "replica rows",
		chromedp.Poll[int](fmt.Sprintf(`document.querySelectorAll('#replicas tbody tr[data-replica]').length === %d && %d`, n, n)))
	if rows != n {
		t.Fatalf("got %d replica rows, want %d", rows, n)
	}
	run(t, ctx, 10*time.Second, "healthy", chromedp.Poll[bool](`document.querySelectorAll('#replicas .badge.up').length === 3`))
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
	run(t, ctx, 5*time.Second, "expand", chromedp.Evaluate[chromedp.Void](`document.querySelector('#decisions tr.decision').click()`))
	cands := run(t, ctx, 5*time.Second, "candidates", chromedp.Poll[int](`document.querySelectorAll('tr.costs table.inner tbody tr').length`))
	if cands != n {
		t.Errorf("%d candidates in the expanded decision, want %d", cands, n)
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

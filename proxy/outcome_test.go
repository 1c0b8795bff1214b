package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/view"
)

// streamUntilDone sends a streamed chat request and reads its events up to
// and including [DONE], then closes the connection at once (the transport
// keeps none alive), as many clients do. It returns the events read.
func streamUntilDone(t *testing.T, client *http.Client, url, body string) []string {
	t.Helper()
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		events = append(events, line)
		if line == "[DONE]" {
			break
		}
	}
	return events
}

// waitSettled waits until no decision of rt is in flight.
func waitSettled(t *testing.T, rt *Router, n int) []view.Decision {
	t.Helper()
	var recs []view.Decision
	wait.For(t, "every request settled", func() bool {
		recs = rt.Decisions(n)
		for _, r := range recs {
			if r.Outcome == view.OutcomeInFlight {
				return false
			}
		}
		return len(recs) == n
	})
	return recs
}

// TestClosedAfterDoneIsOK: a client that closes its connection right after
// [DONE] got the whole answer: 100 of 100 records say ok, and their usage
// is counted.
func TestClosedAfterDoneIsOK(t *testing.T) {
	reps := replicas(t, 2, 0.01)
	rt, url := startRouter(t, "kv-aware", nil, urls(reps)...)
	runRouter(t, rt)
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	const n = 100
	for i := range n {
		body := fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"question %d %s"}]}`, i, words(i, 20))
		if ev := streamUntilDone(t, client, url, body); len(ev) == 0 || ev[len(ev)-1] != "[DONE]" {
			t.Fatalf("request %d: stream %q did not end with [DONE]", i, ev)
		}
	}
	ok := 0
	for _, r := range waitSettled(t, rt, n) {
		if r.Outcome == view.OutcomeOK && r.PromptTokens > 0 {
			ok++
		} else {
			t.Errorf("record %s: outcome %q, prompt tokens %d; want ok with its usage", r.ID, r.Outcome, r.PromptTokens)
		}
	}
	if ok != n {
		t.Errorf("%d of %d recorded ok", ok, n)
	}
	var completed int64
	for _, r := range rt.View(time.Now()).Replicas {
		completed += r.Completed
	}
	if completed != n {
		t.Errorf("fleet counted %d completed, want %d", completed, n)
	}
}

// TestEngineKilledMidStream: an engine that dies while streaming leaves the
// client with a final OpenAI-shaped error event, not a silent end; the
// record says upstream_error and /metrics counts it.
func TestEngineKilledMidStream(t *testing.T) {
	e, err := emulator.Start(emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: 1}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rt, url := startRouter(t, "kv-aware", nil, e.URL())
	runRouter(t, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"max_tokens":2000,"messages":[{"role":"user","content":"write a long story"}]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var events []string
	killed := false
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		events = append(events, line)
		if !killed && len(events) >= 3 {
			killed = true
			go e.Close()
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("stream ended with a read error %v: the client got no error event", err)
	}
	last := events[len(events)-1]
	var ev struct {
		Error *struct {
			Message, Type string
			Code          any
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(last), &ev); err != nil || ev.Error == nil || ev.Error.Code != codeStreamCut || ev.Error.Type != errUpstream {
		t.Fatalf("last event %q (of %d), want an error event with code %s", last, len(events), codeStreamCut)
	}
	rec := waitSettled(t, rt, 1)[0]
	if rec.Outcome != view.OutcomeUpstreamError {
		t.Errorf("record outcome %q, want %s", rec.Outcome, view.OutcomeUpstreamError)
	}
	if got := metricValue(t, url, "kvrouter_errors_total", "code", codeStreamCut); got != 1 {
		t.Errorf("kvrouter_errors_total{code=%q} = %v, want 1", codeStreamCut, got)
	}
}

package proxy

import (
	"encoding/json"
	"fmt"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/view"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// spillResult is one request of TestSharedPrefixSpills, in routing order.
type spillResult struct {
	replica string // X-Kvrouter-Replica
	header  string // X-Kvrouter-Decision
	status  int
}

// TestSharedPrefixSpills: unrelated requests that share a long system
// prompt go to the replica that holds it, until that replica's queue makes
// another replica cheaper; then they spill to a second replica. Real
// emulated replicas run in real time (so that requests queue while the
// next ones are routed); requests are started one at a time, each once the
// previous one's decision is recorded, so the routing order is the
// sending order.
func TestSharedPrefixSpills(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time replicas")
	}
	reps := replicas(t, 3, 1)
	rt, url := startRouter(t, "kv-aware", func(c *Config) { c.ScrapeInterval = 50 * time.Millisecond }, urls(reps)...)
	runRouter(t, rt)
	system := "You are the support agent of ACME. " + words(7, 1500)
	body := func(i int) string {
		b, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 2, "messages": []chatMsg{
			{"system", system}, {"user", fmt.Sprintf("ticket %d: %s", i, words(1000+i, 300))}}})
		return string(b)
	}
	// The first request goes anywhere and leaves the prompt cached there.
	resp, out := do(t, "POST", url+"/v1/chat/completions", body(0))
	if resp.StatusCode != 200 {
		t.Fatalf("first request: status %d: %s", resp.StatusCode, out)
	}
	holder := resp.Header.Get(HeaderReplica)

	// Then a burst of unrelated requests sharing the prompt.
	const n = 40
	results := make([]spillResult, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body(i+1)))
			if err != nil {
				t.Errorf("request %d: %v", i+1, err)
				return
			}
			resp.Body.Close()
			results[i] = spillResult{resp.Header.Get(HeaderReplica), resp.Header.Get(HeaderDecision), resp.StatusCode}
		})
		waitRecords(t, rt, i+2)
	}
	wg.Wait()

	recs := rt.Decisions(n) // newest first
	first := -1             // routing position of the first spill
	for k := range n {
		rec, res := recs[n-1-k], results[k]
		if res.status != 200 || res.replica != rec.Replica || !strings.Contains(res.header, "id="+rec.ID) {
			t.Fatalf("request %d: status %d, header %q %q; record %s on %s", k+1, res.status, res.replica, res.header, rec.ID, rec.Replica)
		}
		t.Logf("request %2d: %-22s %-8s predicted-cached %5d actual %5d", k+1, rec.Replica, rec.Reason, rec.PredictedCached, rec.ActualCached)
		if first < 0 && rec.Replica != holder {
			first = k
		}
	}
	if first < 2 {
		t.Fatalf("spilled at request %d; want at least the first two to follow the holder %s", first+1, holder)
	}
	for k := range first {
		if rec := recs[n-1-k]; rec.Reason != "prefix" || rec.PredictedCached < 1000 {
			t.Errorf("request %d: reason %s, predicted cached %d; want prefix with the system prompt", k+1, rec.Reason, rec.PredictedCached)
		}
	}
	spill := recs[n-1-first]
	if spill.Reason != "replicate" {
		t.Errorf("first spill (request %d): reason %s, want spread", first+1, spill.Reason)
	}
	var atHolder, atSpill view.Candidate
	for _, c := range spill.Candidates {
		switch c.Replica {
		case holder:
			atHolder = c
		case spill.Replica:
			atSpill = c
		}
	}
	if atHolder.Matched <= atSpill.Matched || atHolder.WaitMS <= atSpill.WaitMS || atHolder.TotalMS < atSpill.TotalMS {
		t.Errorf("first spill: holder %+v, chosen %+v; want the holder to match more but wait longer and cost more", atHolder, atSpill)
	}
	if actual := recs[0].ActualCached; actual <= 0 {
		t.Errorf("last request: engine reported %d cached tokens, want the shared prompt", actual)
	}
	served := map[string]int{}
	for _, r := range results {
		served[r.replica]++
	}
	if len(served) < 2 || served[holder] < 3 {
		t.Errorf("served %v; want the holder to take the most and at least one more replica", served)
	}
}

// waitRecords waits until the router has begun n decision records.
func waitRecords(t *testing.T, rt *Router, n int) {
	t.Helper()
	wait.For(t, fmt.Sprintf("%d decision records", n), func() bool {
		rt.decisions.mu.Lock()
		defer rt.decisions.mu.Unlock()
		return rt.decisions.n >= uint64(n)
	})
}

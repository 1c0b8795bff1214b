package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/redisserver"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/peers"
)

// TestSharedAlternatingTurns: two routers on a real Redis, their sync
// interval (200 ms) longer than a whole conversation: six back-to-back
// turns of one session, alternating between them, each sent as soon as
// the previous answer ended, 20 runs. No turn leaves the replica the
// previous turn went to: its router did not know the binding (the stream
// has not carried it yet), but reads the one the other wrote before its
// answer ended; and the other's share, as old as two sync intervals,
// counts the previous turn in flight, but the turn extends that turn's
// prompt, so it has ended (fleet.Fleet.BindPeer), and the replica is not
// priced busy for it.
func TestSharedAlternatingTurns(t *testing.T) {
	rs := redisserver.Start(t)
	reps := replicas(t, 4, 0.01)
	const interval = 200 * time.Millisecond
	rts := make([]*Router, 2)
	us := make([]string, 2)
	for i := range rts {
		rts[i], us[i] = startRouter(t, "kv-aware", func(c *Config) {
			// ReadTimeout: 5 ms by default; 50 here, for a machine the race
			// detector and parallel tests slow down (the mean is logged).
			c.Peers = peers.Settings{URL: rs.URL(), Interval: interval, TTL: 2 * time.Second, Router: fmt.Sprint("router-", i),
				ReadTimeout: 50 * time.Millisecond}
			// A scrape right after the other router's turn shows the
			// replica running a request neither this router's in-flight
			// count nor its (200 ms old) peers' load explains: kv-aware
			// then prices it busy and may replicate the prefix elsewhere,
			// a load-staleness effect of the sync interval, not the
			// binding this test is about.
			c.ScrapeInterval = time.Minute
		}, urls(reps)...)
		runRouter(t, rts[i])
	}
	const runs, turns = 20, 6
	one := 0
	for run := range runs {
		session := fmt.Sprintf("agent-%d-%d", run, time.Now().UnixNano())
		msgs := []chatMsg{{"system", "You are an agent. " + words(900+run, 30)}}
		served := map[string]int{}
		prev := ""
		start := time.Now()
		for turn := range turns {
			msgs = append(msgs, chatMsg{"user", words(1000*run+turn, 40)})
			b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "max_tokens": 4})
			resp, body := do(t, "POST", us[turn%2]+"/v1/chat/completions", string(b), "X-Session-ID", session)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("run %d turn %d: status %d: %s", run, turn, resp.StatusCode, body)
			}
			var r chatResp
			if err := json.Unmarshal([]byte(body), &r); err != nil || len(r.Choices) == 0 {
				t.Fatalf("run %d turn %d: %v: %s", run, turn, err, body)
			}
			rep, reason := resp.Header.Get(HeaderReplica), decisionField(resp.Header.Get(HeaderDecision), "reason")
			if prev != "" && rep != prev {
				t.Errorf("run %d turn %d: %s (reason %s) after %s: the session moved", run, turn, rep, reason, prev)
			}
			prev = rep
			served[rep]++
			msgs = append(msgs, r.Choices[0].Message)
		}
		if took := time.Since(start); took >= interval {
			t.Logf("run %d: %d turns took %v, longer than the sync interval", run, turns, took)
		}
		if len(served) == 1 {
			one++
		}
	}
	t.Logf("%d of %d runs on one replica", one, runs)
	// Every session request reads Redis: turn 1 (router 0) finds
	// nothing, the others the binding the previous turn wrote.
	for i, u := range us {
		h := families(t, u)["kvrouter_shared_session_read_seconds"].GetMetric()[0].GetHistogram()
		r := func(result string) float64 {
			return metricValue(t, u, "kvrouter_shared_session_reads_total", "result", result)
		}
		t.Logf("router %d: %d session reads (hit %v, miss %v, timeout %v, error %v), mean %.3f ms", i, h.GetSampleCount(),
			r("hit"), r("miss"), r("timeout"), r("error"), 1000*h.GetSampleSum()/float64(max(h.GetSampleCount(), 1)))
	}
	if hits := metricValue(t, us[1], "kvrouter_shared_session_reads_total", "result", "hit"); hits < runs {
		t.Errorf("router 1: %v session reads hit Redis, want at least %d (turn 2 of each run)", hits, runs)
	}
}

// adminDo sends an admin API request with a JSON body to admin.
func adminDo(t *testing.T, admin, method, path, body string) {
	t.Helper()
	resp, out := do(t, method, admin+path, body)
	if resp.StatusCode >= 300 && resp.StatusCode != http.StatusAccepted {
		t.Fatalf("%s %s %s: status %d: %s", method, path, body, resp.StatusCode, out)
	}
}

// backendStates returns url → state of rt's backends.
func backendStates(rt *Router) map[string]string {
	out := map[string]string{}
	for _, b := range rt.Backends() {
		out[b.URL] = b.State
	}
	return out
}

// TestSharedAdminChanges: an admin change made on router A (add, drain,
// remove, then on B undrain, and a role given on re-adding a backend) is
// applied by the other router within the sync bound
// (2 intervals and a round trip, with slack for a loaded machine), and a
// router A restarted with its original --backend list loads the shared
// membership: the added backend, the drained one, not the removed one.
func TestSharedAdminChanges(t *testing.T) {
	rs := redisserver.Start(t)
	reps := replicas(t, 3, 0.01)
	u := urls(reps)
	const interval = 50 * time.Millisecond
	bound := 2*interval + 150*time.Millisecond
	start := func(name string) (*Router, string, context.CancelFunc) {
		rt := newTestRouter(t, "kv-aware", func(c *Config) {
			c.Peers = peers.Settings{URL: rs.URL(), Interval: interval, TTL: time.Second, Router: name}
		}, u[0], u[1])
		adm := httptest.NewServer(rt.AdminHandler())
		t.Cleanup(adm.Close)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { rt.Run(ctx); close(done) }()
		stop := func() { cancel(); <-done }
		t.Cleanup(stop)
		return rt, adm.URL, stop
	}
	a, aAdmin, stopA := start("router-a")
	b, bAdmin, _ := start("router-b")
	seen := func(rt *Router, what string, ok func(map[string]string) bool) {
		t.Helper()
		t0 := time.Now()
		wait.For(t, what, func() bool { return ok(backendStates(rt)) })
		took := time.Since(t0)
		t.Logf("%s after %v", what, took.Round(time.Millisecond))
		if took > bound {
			t.Errorf("%s after %v, want within %v", what, took, bound)
		}
	}
	adminDo(t, aAdmin, "POST", pathBackends, fmt.Sprintf(`{"url": %q, "models": ["m"]}`, u[2]))
	seen(b, "B serves the backend added on A", func(s map[string]string) bool { return s[u[2]] == "serving" })
	adminDo(t, aAdmin, "POST", pathDrain, fmt.Sprintf(`{"url": %q}`, u[1]))
	seen(b, "B drains the backend drained on A", func(s map[string]string) bool { return s[u[1]] == "draining" })
	adminDo(t, aAdmin, "DELETE", pathBackends, fmt.Sprintf(`{"url": %q}`, u[0]))
	seen(b, "B removes the backend removed on A", func(s map[string]string) bool { _, ok := s[u[0]]; return !ok })
	adminDo(t, bAdmin, "POST", pathUndrain, fmt.Sprintf(`{"url": %q}`, u[1]))
	seen(a, "A undrains the backend undrained on B", func(s map[string]string) bool { return s[u[1]] == "serving" })
	adminDo(t, bAdmin, "POST", pathDrain, fmt.Sprintf(`{"url": %q}`, u[1]))
	seen(a, "A drains the backend drained on B", func(s map[string]string) bool { return s[u[1]] == "draining" })

	stopA()
	a2, a2Admin, _ := start("router-a")
	seen(a2, "restarted A loads the shared membership", func(s map[string]string) bool {
		_, removed := s[u[0]]
		return !removed && s[u[1]] == "draining" && s[u[2]] == "serving"
	})
	if want, got := backendStates(b), backendStates(a2); fmt.Sprint(want) != fmt.Sprint(got) {
		t.Errorf("restarted A's backends %v, B's %v: want the same", got, want)
	}
	// A role change: removed and added again with its new role on A2.
	adminDo(t, a2Admin, "DELETE", pathBackends, fmt.Sprintf(`{"url": %q}`, u[2]))
	adminDo(t, a2Admin, "POST", pathBackends, fmt.Sprintf(`{"url": %q, "models": ["m"], "role": "decode"}`, u[2]))
	seen(b, "B takes the role given on A", func(map[string]string) bool {
		for _, bs := range b.Backends() {
			if bs.URL == u[2] && bs.State == "serving" && bs.Role == "decode" {
				return true
			}
		}
		return false
	})
	for name, rt := range map[string]*Router{"B": b, "A2": a2} {
		var out strings.Builder
		for _, bs := range rt.Backends() {
			fmt.Fprintf(&out, " %s=%s", bs.URL, bs.State)
		}
		t.Logf("%s:%s", name, out.String())
	}
}

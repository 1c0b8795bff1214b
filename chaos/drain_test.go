package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/wait"
)

// stream is what a client saw of one streamed completion.
type stream struct {
	status int
	last   string // the last non-empty line
	done   bool   // a "data: [DONE]" line came
	err    error  // reading the body
	took   time.Duration
}

// streams sends n streamed chat completions of maxTokens each to url at
// once. started is closed when every one has its first event; the
// results arrive when all have ended.
func streams(t *testing.T, url string, n, maxTokens int) (started <-chan struct{}, results <-chan []stream) {
	t.Helper()
	first := make(chan struct{})
	out := make(chan []stream, 1)
	var firsts sync.WaitGroup
	firsts.Add(n)
	go func() { firsts.Wait(); close(first) }()
	go func() {
		res := make([]stream, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				res[i] = readStream(t, url, fmt.Sprintf("tell story %d, a long one", i), maxTokens, firsts.Done)
			})
		}
		wg.Wait()
		out <- res
	}()
	return first, out
}

// readStream sends one streamed completion and reads it to its end,
// calling onFirst once at its first event (or its failure).
func readStream(t *testing.T, url, prompt string, maxTokens int, onFirst func()) stream {
	var once sync.Once
	defer once.Do(onFirst)
	begin := time.Now()
	resp, err := post(context.Background(), t, url, "/v1/chat/completions", chat(prompt, maxTokens, true))
	if err != nil {
		return stream{err: err}
	}
	defer resp.Body.Close()
	s := stream{status: resp.StatusCode}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if l == "" {
			continue
		}
		once.Do(onFirst)
		s.last = l
		s.done = s.done || l == "data: [DONE]"
	}
	s.err, s.took = sc.Err(), time.Since(begin)
	return s
}

// within waits up to d for results.
func within(t *testing.T, results <-chan []stream, d time.Duration) []stream {
	t.Helper()
	select {
	case r := <-results:
		return r
	case <-time.After(d):
		t.Fatalf("streams not over within %v", d)
		return nil
	}
}

// pollStatus waits up to d until GET url answers want (0: the connection
// is refused or fails), and returns how long it took.
func pollStatus(t *testing.T, url string, want int, d time.Duration) time.Duration {
	t.Helper()
	client := &http.Client{Timeout: time.Second}
	return wait.Within(t, d, fmt.Sprintf("GET %s answering %d", url, want), func() bool {
		got := 0
		if resp, err := client.Get(url); err == nil {
			got = resp.StatusCode
			resp.Body.Close()
		}
		return got == want
	})
}

// TestDrainFinishesStreams: SIGTERM with 20 streams of ~30 s in flight
// and --drain-timeout 60s. The router turns unready at once (/readyz 503
// on the admin listener, no new connections on the API port), logs its
// progress, lets all 20 streams finish with [DONE] and exits 0.
func TestDrainFinishesStreams(t *testing.T) {
	t.Parallel()
	const n, tokens = 20, 300 // 300 tokens at 20 in a batch: ~30 s at --time-scale 10
	engine := startEngine(t, "--time-scale", "10")
	rt := startRouter(t, []*proc{engine}, "--drain-timeout", "60s")
	admin := rt.AdminURL()
	waitReady(t, rt.URL(), "/readyz", 10*time.Second)
	started, results := streams(t, rt.URL(), n, tokens)
	<-started
	rt.Signal(syscall.SIGTERM)
	d := pollStatus(t, admin+"/readyz", http.StatusServiceUnavailable, 2*time.Second)
	if d > time.Second {
		t.Errorf("/readyz turned 503 %v after SIGTERM, want at once", d)
	}
	t.Logf("/readyz 503 %v after SIGTERM", d)
	pollStatus(t, rt.URL()+"/health", 0, 2*time.Second) // the API port takes no new connection
	res := within(t, results, 70*time.Second)
	complete := 0
	for i, s := range res {
		if s.status == 200 && s.done && s.err == nil {
			complete++
		} else {
			t.Errorf("stream %d: status %d, [DONE] %v, err %v, last %q; want 200 to [DONE]", i, s.status, s.done, s.err, s.last)
		}
		if s.took < 20*time.Second {
			t.Errorf("stream %d took %v, want the ~30 s it needs (the engine's pace)", i, s.took)
		}
	}
	t.Logf("%d of %d streams complete; first took %v", complete, n, res[0].took)
	if code := rt.Wait(10 * time.Second); code != 0 {
		t.Errorf("exit code %d, want 0 (drain complete)", code)
	}
	log := rt.Log()
	for _, want := range []string{"draining: unready", "msg=draining in_flight=", "drain complete", "kvrouter stopped"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q", want)
		}
	}
}

// TestDrainTimeoutCutsStreams: a drain that times out ends the streams
// still in flight with a final OpenAI-shaped SSE error event (no [DONE],
// a clean end of the body) and the router exits non-zero.
func TestDrainTimeoutCutsStreams(t *testing.T) {
	t.Parallel()
	engine := startEngine(t, "--time-scale", "10")
	rt := startRouter(t, []*proc{engine}, "--drain-timeout", "1s", "--admin-listen", "")
	waitReady(t, rt.URL(), "/readyz", 10*time.Second)
	started, results := streams(t, rt.URL(), 5, 300)
	<-started
	sent := time.Now()
	rt.Signal(syscall.SIGTERM)
	res := within(t, results, 15*time.Second)
	d := time.Since(sent)
	if d > 8*time.Second {
		t.Errorf("streams ended %v after SIGTERM, want about the 1 s drain timeout", d)
	}
	t.Logf("%d streams ended %v after SIGTERM", len(res), d)
	for i, s := range res {
		var e struct {
			Error struct{ Message, Type, Code string }
		}
		data, _ := strings.CutPrefix(s.last, "data: ")
		if s.status != 200 || s.done || s.err != nil || json.Unmarshal([]byte(data), &e) != nil || e.Error.Code != "server_shutting_down" {
			t.Errorf("stream %d: status %d, [DONE] %v, err %v, last %q; want 200 ending in an error event server_shutting_down",
				i, s.status, s.done, s.err, s.last)
		}
	}
	if code := rt.Wait(15 * time.Second); code == 0 {
		t.Error("exit code 0, want non-zero (drain incomplete)")
	}
	if !strings.Contains(rt.Log(), "drain incomplete") {
		t.Error(`log lacks "drain incomplete"`)
	}
}

// TestSIGHUPKeepsServing: SIGHUP is logged and the router goes on serving.
func TestSIGHUPKeepsServing(t *testing.T) {
	t.Parallel()
	engine := startEngine(t, "--time-scale", "0.01")
	rt := startRouter(t, []*proc{engine}, "--admin-listen", "")
	waitReady(t, rt.URL(), "/readyz", 10*time.Second)
	rt.Signal(syscall.SIGHUP)
	wait.For(t, "the SIGHUP logged or the router gone", func() bool { return strings.Contains(rt.Log(), "SIGHUP") || !rt.Alive() })
	if !rt.Alive() {
		t.Fatalf("the router exited on SIGHUP")
	}
	if !strings.Contains(rt.Log(), "SIGHUP received") {
		t.Error("SIGHUP not logged")
	}
	s := readStream(t, rt.URL(), "hello after hangup", 8, func() {})
	if s.status != 200 || !s.done {
		t.Errorf("after SIGHUP: status %d, [DONE] %v, err %v; want 200 to [DONE]", s.status, s.done, s.err)
	}
}

package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/wait"
)

// Upstream faults: a hung engine (SIGSTOP), an engine killed mid-stream
// (SIGKILL), requests queued inside a dying engine, a replica answering 500
// while its /health says 200, one refusing connections, and another
// service taking a dead engine's port.

// midStream is a fault sent to an engine in the middle of streams.
type midStream struct {
	rt     *proc
	res    []*streamResult
	want   string // the whole reply each stream should end up with
	victim *proc  // the engine that got the signal
	n      int    // the streams it was serving
	plain  []plainResult
}

// plainResult is what a client saw of a non-streaming chat completion.
type plainResult struct {
	status int
	text   string
	end    time.Time
}

// faultMidStream runs three engines behind a round-robin router (with
// args), starts streams streamed chats and, once each had a token, sends
// sig to the engine serving most of them; it returns when all ended.
func faultMidStream(t *testing.T, sig syscall.Signal, streams, plain int, args ...string) midStream {
	t.Helper()
	engines := []*proc{startEngine(t), startEngine(t), startEngine(t)}
	rt := startRouter(t, engines, append([]string{"--policy", "round-robin"}, args...)...)
	waitReady(t, rt.URL(), "/health", 10*time.Second)
	const tokens = 150
	f := midStream{rt: rt, want: wholeText(t, engines[0].URL(), tokens), plain: make([]plainResult, plain)}
	res, wait := startStreams(t, rt.URL(), streams, tokens)
	var wg sync.WaitGroup
	for i := range f.plain {
		wg.Go(func() { f.plain[i] = plainChat(t, rt.URL(), tokens, i) })
	}
	waitFirstTokens(t, res)
	f.res = res
	f.victim, f.n = busiest(engines, res)
	f.victim.Signal(sig)
	wait()
	wg.Wait()
	return f
}

// plainChat sends a non-streaming chat of maxTokens tokens.
func plainChat(t *testing.T, url string, maxTokens, i int) plainResult {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	body := fmt.Appendf(nil, `{"model":"emulated","max_tokens":%d,"messages":[{"role":"user","content":"plain question %d"}]}`, maxTokens, i)
	resp, err := post(ctx, t, url, "/v1/chat/completions", body)
	if err != nil {
		return plainResult{status: -1, end: time.Now()}
	}
	defer resp.Body.Close()
	var r struct {
		Choices []struct {
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	json.NewDecoder(resp.Body).Decode(&r)
	out := plainResult{status: resp.StatusCode, end: time.Now()}
	if len(r.Choices) == 1 {
		out.text = r.Choices[0].Message.Content
	}
	return out
}

// startBeside runs a router in front of backend (a URL no engine
// process serves) and engines, with probes every probe.
func startBeside(t *testing.T, backend string, engines []*proc, probe string) *proc {
	t.Helper()
	admin := freeAddr(t)
	a := []string{"serve", "--health-interval", probe, "--scrape-interval", "100ms", "--backend", backend, "--admin-listen", admin, "--client-headers"}
	for _, e := range engines {
		a = append(a, "--backend", e.URL())
	}
	p := start(t, a...)
	p.admin = admin
	return p
}

// TestStoppedEngine stops (SIGSTOP) the engine serving most of several
// in-flight streams: its streams go silent, are given up after the
// stream-idle timeout and continued on another engine to [DONE], with no
// gap much longer than the timeout; later requests avoid it.
func TestStoppedEngine(t *testing.T) {
	const idle = time.Second
	stoppedAt := time.Now()
	f := faultMidStream(t, syscall.SIGSTOP, 6, 6, "--stream-idle-timeout", idle.String(), "--ttft-timeout", "30s")
	rt, res, want, stopped, n := f.rt, f.res, f.want, f.victim, f.n
	var slowest time.Duration
	for i, p := range f.plain {
		slowest = max(slowest, p.end.Sub(stoppedAt))
		if p.status != http.StatusOK || p.text != want {
			t.Errorf("non-streaming request %d: status %d, text %q; want 200, the whole reply", i, p.status, p.text)
		}
	}
	t.Logf("non-streaming requests: all done %v after the start (the stopped engine's retried once probes ejected it: %v)", slowest,
		metricSum(t, rt.AdminURL(), "kvrouter_upstream_timeouts_total", `kind="probe"`))
	done, _ := checkStreams(t, res, want)
	if done != len(res) {
		t.Errorf("%d of %d streams continued to [DONE], want all (two other engines were up)", done, len(res))
	}
	var worst time.Duration
	for i, r := range res {
		if r.replica != stopped.URL() {
			continue
		}
		worst = max(worst, r.maxGap)
		if r.maxGap > idle+2*time.Second {
			t.Errorf("stream %d on the stopped engine waited %v between two events; want about the %v idle timeout", i, r.maxGap, idle)
		}
	}
	t.Logf("%d of %d streams on the stopped engine; longest silence a client saw: %v (idle timeout %v)", n, len(res), worst, idle)
	if got := metricSum(t, rt.AdminURL(), "kvrouter_upstream_timeouts_total", `kind="idle"`); got < float64(n) {
		t.Errorf("kvrouter_upstream_timeouts_total{kind=idle} = %v, want at least the %d streams on the stopped engine", got, n)
	}
	if got := metricSum(t, rt.AdminURL(), "kvrouter_stream_failures_total", `result="continued"`); got < float64(n) {
		t.Errorf("kvrouter_stream_failures_total{result=continued} = %v, want at least %d", got, n)
	}
	wait.Within(t, 5*time.Second, "ejection of the stopped engine", func() bool {
		return metricSum(t, rt.AdminURL(), "kvrouter_replica_healthy", `replica="`+stopped.URL()+`"`) == 0
	})
	for i := range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := post(ctx, t, rt.URL(), "/v1/chat/completions", chat(fmt.Sprintf("later %d", i), 4, false))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		cancel()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Kvrouter-Replica") == stopped.URL() {
			t.Errorf("later request %d: status %d from %s; want 200 from another engine", i, resp.StatusCode, resp.Header.Get("X-Kvrouter-Replica"))
		}
	}
}

// TestStoppedEngineEjected: with the default 30 s stream-idle timeout, a
// stopped (SIGSTOP) engine's streams past their first token move on
// within about a second of the probes' ejection of it, not at the idle
// timeout: each is continued on another engine to [DONE] with the whole
// reply.
func TestStoppedEngineEjected(t *testing.T) {
	f := faultMidStream(t, syscall.SIGSTOP, 6, 0, "--ttft-timeout", "30s")
	done, _ := checkStreams(t, f.res, f.want)
	if done != len(f.res) {
		t.Errorf("%d of %d streams continued to [DONE], want all (two other engines were up)", done, len(f.res))
	}
	var worst time.Duration
	for i, r := range f.res {
		if r.replica != f.victim.URL() {
			continue
		}
		worst = max(worst, r.maxGap)
		// Probes every 100 ms eject it within a second or so, then a
		// second of silence: far under the 30 s idle timeout on any load.
		if r.maxGap > 15*time.Second {
			t.Errorf("stream %d on the stopped engine waited %v between two events; want about a second past its ejection", i, r.maxGap)
		}
	}
	t.Logf("%d of %d streams on the stopped engine; longest silence a client saw: %v (stream-idle timeout 30s)", f.n, len(f.res), worst)
	if got := metricSum(t, f.rt.AdminURL(), "kvrouter_upstream_timeouts_total", `kind="probe"`); got < float64(f.n) {
		t.Errorf("kvrouter_upstream_timeouts_total{kind=probe} = %v, want at least the %d streams on the stopped engine", got, f.n)
	}
}

// TestKilledEngineMidStream kills (SIGKILL) the engine serving most of
// several streams: every client stream is continued to [DONE] with the
// whole reply and nothing duplicated, or ends with an SSE error event,
// never silently; /metrics counts each.
func TestKilledEngineMidStream(t *testing.T) {
	f := faultMidStream(t, syscall.SIGKILL, 9, 0)
	rt, res, want, n := f.rt, f.res, f.want, f.n
	done, errored := checkStreams(t, res, want)
	t.Logf("%d streams on the killed engine; %d of %d continued to [DONE], %d ended with an error event", n, done, len(res), errored)
	failures := metricSum(t, rt.AdminURL(), "kvrouter_stream_failures_total")
	if failures < float64(n) || metricSum(t, rt.AdminURL(), "kvrouter_stream_failures_total", `result="error"`) != float64(errored) {
		t.Errorf("kvrouter_stream_failures_total = %v (error %v), want at least %d, error %d", failures,
			metricSum(t, rt.AdminURL(), "kvrouter_stream_failures_total", `result="error"`), n, errored)
	}
}

// TestQueuedInDyingEngine kills an engine that runs one request at a time
// with several more queued inside it (their 200 and headers sent, no
// token yet): the queued ones are retried elsewhere and succeed, the
// running one is continued.
func TestQueuedInDyingEngine(t *testing.T) {
	dying := startEngine(t, "--max-num-seqs", "1")
	engines := []*proc{dying, startEngine(t)}
	rt := startRouter(t, engines, "--policy", "round-robin")
	waitReady(t, rt.URL(), "/health", 10*time.Second)
	const tokens = 100
	want := wholeText(t, engines[1].URL(), tokens)
	res, finished := startStreams(t, rt.URL(), 8, tokens)
	wait.Within(t, 10*time.Second, "requests queued in the engine", func() bool {
		return metricSum(t, dying.URL(), "vllm:num_requests_waiting") >= 2 && metricSum(t, dying.URL(), "vllm:num_requests_running") == 1
	})
	queued := metricSum(t, dying.URL(), "vllm:num_requests_waiting")
	dying.Signal(syscall.SIGKILL)
	finished()

	done, _ := checkStreams(t, res, want)
	if done != len(res) {
		t.Errorf("%d of %d streams completed, want all", done, len(res))
	}
	retried := metricSum(t, rt.AdminURL(), "kvrouter_retries_total", `replica="`+dying.URL()+`"`)
	t.Logf("%v requests queued in the killed engine; %v retried elsewhere, %d of %d streams completed", queued, retried, done, len(res))
	if got := retried; got < queued {
		t.Errorf("kvrouter_retries_total{replica=dying} = %v, want at least the %v queued requests", got, queued)
	}
}

// badReplica is a tiny real HTTP server standing in for a broken replica:
// /health says 200 and /v1/models lists the model, but every completion
// gets a 500 at once (mode "500"), or it lists another model (mode
// "impostor").
type badReplica struct {
	mode  string
	model string
	hits  atomic.Int64 // completion requests
}

func (b *badReplica) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/health":
	case "/v1/models":
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model"}]}`, b.model)
	case "/v1/chat/completions", "/v1/completions":
		b.hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, `{"error":{"message":"internal error","type":"InternalServerError","code":500}}`)
	default:
		http.NotFound(w, r)
	}
}

// serve runs h on addr ("127.0.0.1:0" for any port) until the test ends.
func serve(t *testing.T, addr string, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// load sends n non-streaming chats from conc clients and returns the
// statuses seen.
func load(t *testing.T, url string, n, conc int) map[int]int {
	return loadUntil(t, url, n, time.Time{}, conc)
}

// loadUntil sends non-streaming chats from conc clients, n of them or
// (with n zero) until end, and returns the statuses seen.
func loadUntil(t *testing.T, url string, n int, end time.Time, conc int) map[int]int {
	var mu sync.Mutex
	statuses := map[int]int{}
	var next atomic.Int64
	var wg sync.WaitGroup
	more := func(i int64) bool {
		if n > 0 {
			return i <= int64(n)
		}
		return time.Now().Before(end)
	}
	for range conc {
		wg.Go(func() {
			for i := next.Add(1); more(i); i = next.Add(1) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				status := -1
				if resp, err := post(ctx, t, url, "/v1/chat/completions", chat(fmt.Sprintf("q %d", i), 2, false)); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					status = resp.StatusCode
				}
				cancel()
				mu.Lock()
				statuses[status]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return statuses
}

// TestReplicaAnswering500 puts a replica that answers every completion
// 500 at once, while its /health says 200, beside two engines: it is
// ejected for growing times instead of flapping, and fewer than 0.1% of
// client requests see a 500.
func TestReplicaAnswering500(t *testing.T) {
	bad := &badReplica{mode: "500", model: "emulated"}
	badURL := serve(t, "127.0.0.1:0", bad)
	engines := []*proc{startEngine(t, "--time-scale", "0.01"), startEngine(t, "--time-scale", "0.01")}
	rt := startBeside(t, badURL, engines, "100ms")
	waitReady(t, rt.URL(), "/health", 10*time.Second)
	d := 5 * time.Second
	if *long {
		d = 30 * time.Second
	}
	begin := time.Now()
	statuses := loadUntil(t, rt.URL(), 0, begin.Add(d), 8)
	took := time.Since(begin)
	n := 0
	for _, k := range statuses {
		n += k
	}
	if statuses[http.StatusInternalServerError]*1000 >= n || statuses[http.StatusOK] < n*999/1000 {
		t.Errorf("statuses %v of %d requests: want fewer than 0.1%% 500s", statuses, n)
	}
	downs := strings.Count(rt.Log(), `msg="replica down" replica=`+badURL)
	ejections := metricSum(t, rt.AdminURL(), "kvrouter_ejections_total", `replica="`+badURL+`"`)
	t.Logf("%d requests in %v: %v; bad replica hit %d times, ejected %v times, %d down transitions logged", n, took, statuses, bad.hits.Load(), ejections, downs)
	// Out 1 s, 2 s, 4 s ... 30 s: 2 or 3 ejections in 5 s, 5 or 6 in 30 s;
	// not one per probe (50 in 5 s).
	maxEj := 1 + math.Log2(took.Seconds()+1)
	if ejections < 2 || ejections > maxEj || float64(downs) != ejections {
		t.Errorf("ejections: %v counted, %d logged in %v; want 2..%.1f, the same", ejections, downs, took, maxEj)
	}
}

// TestRefusingBackend puts a backend that refuses connections beside two
// engines, with probes too rare to notice it: the first refused request
// ejects it, so that it draws no more than a handful of requests.
func TestRefusingBackend(t *testing.T) {
	refusing := "http://" + freeAddr(t)
	engines := []*proc{startEngine(t, "--time-scale", "0.01"), startEngine(t, "--time-scale", "0.01")}
	rt := startBeside(t, refusing, engines, "30s")
	statuses := load(t, rt.URL(), 300, 4)
	if statuses[http.StatusOK] != 300 {
		t.Errorf("statuses %v, want 300 of 300 ok", statuses)
	}
	drawn := metricSum(t, rt.AdminURL(), "kvrouter_retries_total", `replica="`+refusing+`"`) + metricSum(t, rt.AdminURL(), "kvrouter_requests_total", `replica="`+refusing+`"`)
	t.Logf("the refusing backend drew %v of 300 requests", drawn)
	if drawn > 4 {
		t.Errorf("the refusing backend drew %v of 300 requests, want a handful (<= 4)", drawn)
	}
	if got := metricSum(t, rt.AdminURL(), "kvrouter_ejections_total", `replica="`+refusing+`"`, `kind="connect"`); got != 1 {
		t.Errorf("connect ejections of the refusing backend: got %v, want 1", got)
	}
}

// TestImpostorOnDeadPort kills an engine and starts another service on its
// port that answers /health 200 but lists another model: it is never put
// back in rotation.
func TestImpostorOnDeadPort(t *testing.T) {
	engines := []*proc{startEngine(t, "--time-scale", "0.01"), startEngine(t, "--time-scale", "0.01")}
	rt := startRouter(t, engines)
	waitReady(t, rt.URL(), "/health", 10*time.Second)
	dead := engines[0]
	healthy := func() float64 {
		return metricSum(t, rt.AdminURL(), "kvrouter_replica_healthy", `replica="`+dead.URL()+`"`)
	}
	time.Sleep(300 * time.Millisecond) // a few probes: the router learns the engine's models
	dead.Signal(syscall.SIGKILL)
	dead.Wait(5 * time.Second)
	wait.Within(t, 5*time.Second, "the dead engine's ejection", func() bool { return healthy() == 0 })
	imp := &badReplica{mode: "impostor", model: "some-other-model"}
	serve(t, dead.addr, imp)
	// Staying out for 4 s is the behaviour under test.
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if healthy() != 0 {
			t.Fatalf("the other service on %s was put back in rotation", dead.addr)
		}
	}
	statuses := load(t, rt.URL(), 20, 2)
	if statuses[http.StatusOK] != 20 || imp.hits.Load() != 0 {
		t.Errorf("statuses %v, other service hit %d times; want 20 ok, 0", statuses, imp.hits.Load())
	}
	if !strings.Contains(rt.Log(), "replica kept out") || metricSum(t, rt.AdminURL(), "kvrouter_readmission_refused_total") < 1 {
		t.Errorf("no log line or count for the refused re-admission; log:\n%s", rt.Log())
	}
}

package proxy

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/route"
)

// Events of a streamed chat completion, as the test upstreams send them
// (bare1 and bare2 as the router hands on chunk1 and chunk2 when it
// strips the usage it asked for).
var (
	chunk1    = event(`{"id":"c","choices":[{"delta":{"content":"Hi"}}],"usage":null}`)
	chunk2    = event(`{"id":"c","choices":[{"delta":{"content":" there"}}],"usage":null}`)
	usageOnly = event(`{"id":"c","choices":[],"usage":{"prompt_tokens":100,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":64}}}`)
	done      = event(`[DONE]`)
	bare1     = event(`{"id":"c","choices":[{"delta":{"content":"Hi"}}]}`)
	bare2     = event(`{"id":"c","choices":[{"delta":{"content":" there"}}]}`)
)

// event is the SSE event of one data line.
func event(data string) string { return "data: " + data + "\n\n" }

// streamUpstream answers every request with a short SSE stream (8 chunks and
// the usage chunk when asked), as fast as loopback allows.
func streamUpstream() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for range 8 {
			io.WriteString(w, chunk1)
			fl.Flush()
		}
		if strings.Contains(string(body), `"include_usage":true`) {
			io.WriteString(w, usageOnly)
		}
		io.WriteString(w, done)
	}))
}

// BenchmarkProxy measures the latency the router adds to one streamed chat
// request on loopback: each iteration sends the same request directly to an
// upstream and through the router to it, and reports the p50 and p99 of
// both and of the difference (budget: ≤ 1 ms added at p99). B/op and
// allocs/op count both requests and every side of them (client, router,
// upstream), all in this process. On a shared machine the tail is noisy:
// run ten times and take the median run.
//
//	go test -run='^$' -bench=Proxy -benchmem -count=10 ./proxy
func BenchmarkProxy(b *testing.B) {
	up := streamUpstream()
	defer up.Close()
	cfg := DefaultConfig()
	cfg.Policy = "kv-aware"
	cfg.Backends = []Backend{{URL: up.URL}}
	rt, err := New(cfg, Deps{Registry: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(rt.Handler())
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, DisableCompression: true}}
	body := `{"model":"m","stream":true,"max_tokens":8,"messages":[{"role":"system","content":"` + strings.Repeat("You are a helpful assistant. ", 40) + `"},{"role":"user","content":"hello"}]}`
	get := func(url string) time.Duration {
		t0 := time.Now()
		resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || n == 0 {
			b.Fatalf("status %d, %d bytes", resp.StatusCode, n)
		}
		return time.Since(t0)
	}
	get(up.URL)
	get(srv.URL)
	var direct, routed []time.Duration
	b.ReportAllocs()
	for b.Loop() {
		direct = append(direct, get(up.URL))
		routed = append(routed, get(srv.URL))
	}
	slices.Sort(direct)
	slices.Sort(routed)
	q := func(s []time.Duration, p float64) float64 {
		return float64(s[min(int(p*float64(len(s))), len(s)-1)].Microseconds())
	}
	b.ReportMetric(q(direct, 0.5), "direct-p50-µs")
	b.ReportMetric(q(routed, 0.5), "routed-p50-µs")
	b.ReportMetric(q(routed, 0.5)-q(direct, 0.5), "added-p50-µs")
	b.ReportMetric(q(direct, 0.99), "direct-p99-µs")
	b.ReportMetric(q(routed, 0.99), "routed-p99-µs")
	b.ReportMetric(q(routed, 0.99)-q(direct, 0.99), "added-p99-µs")
}

// BenchmarkDecide measures the router's whole decision for one chat
// request, with no network: hashing the parsed prompt, matching its blocks
// in the residency index, the fleet snapshot, kv-aware's Pick, the commit,
// the index update and the decision record. The fleet is warm: 256
// conversations sharing a system prompt have each been routed once, and
// each op routes the next turn of one of them. decide-µs is what
// kvrouter_decision_seconds observes (from the index match on), pick-µs
// the policy's Pick alone, and ns/op minus pick-µs what the router adds
// around it:
//
//	go test -run='^$' -bench=Decide -benchmem ./proxy
func BenchmarkDecide(b *testing.B) {
	system := strings.Repeat("You are a careful assistant. Answer briefly and cite sources. ", 40)
	for _, n := range []int{8, 64, 1000} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Policy = "kv-aware"
			for i := range n {
				cfg.Backends = append(cfg.Backends, Backend{URL: fmt.Sprintf("http://10.%d.%d.1:8000", i/256, i%256)})
			}
			kv, err := route.New(cfg.Policy)
			if err != nil {
				b.Fatal(err)
			}
			pick := &timedPolicy{p: kv}
			rt, err := New(cfg, Deps{Registry: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler), Policy: pick})
			if err != nil {
				b.Fatal(err)
			}
			req := httptest.NewRequest("POST", "/v1/chat/completions", nil)
			prompts := make([]*prefix.Prompt, 256)
			sessions := make([]string, len(prompts))
			for k := range prompts {
				body := fmt.Sprintf(`{"model":"m","max_tokens":64,"messages":[{"role":"system","content":%q},`+
					`{"role":"user","content":"conversation %d: tell me about item %d"}]}`, system, k, k*7)
				sessions[k] = fmt.Sprint("s", k)
				if prompts[k], err = prefix.Parse([]byte(body)); err != nil {
					b.Fatal(err)
				}
			}
			decide := func(k int) time.Duration {
				c := rt.newCall(req, true)
				c.prompt, c.session = prompts[k%len(prompts)], sessions[k%len(prompts)]
				if !c.route(nil) {
					b.Fatal("no replica chosen")
				}
				c.ticket.Done(rt.now(), fleet.NoUsage, nil)
				d := c.decide
				rt.putCall(c)
				return d
			}
			for k := range prompts {
				decide(k)
			}
			var total time.Duration
			k := 0
			pick.spent = 0
			b.ReportAllocs()
			for b.Loop() {
				total += decide(k)
				k++
			}
			b.ReportMetric(float64(total.Microseconds())/float64(max(k, 1)), "decide-µs")
			b.ReportMetric(float64(pick.spent.Nanoseconds())/1e3/float64(max(k, 1)), "pick-µs")
		})
	}
}

// timedPolicy is a policy whose Pick is timed, for BenchmarkDecide.
type timedPolicy struct {
	p     route.Policy
	spent time.Duration
}

// Pick calls the policy's, adding its time to spent.
func (t *timedPolicy) Pick(r *route.Request, s *route.Snapshot) route.Decision {
	t0 := time.Now()
	d := t.p.Pick(r, s)
	t.spent += time.Since(t0)
	return d
}

// Needs returns the policy's.
func (t *timedPolicy) Needs() route.Needs { return route.NeedsOf(t.p) }

// BenchmarkRecording measures what --record costs the request path under
// load: 256 concurrent streams (b.SetParallelism) of chat requests, each
// of its own session, through the router to a fast upstream, with the
// recorder off and on (to a file in the test's temporary directory). It
// reports the p50 and p99 of a request's latency and, with the recorder
// on, the requests dropped (none while the writer keeps up: the queue's
// bound is 4096):
//
//	go test -run='^$' -bench=Recording -benchmem -count=6 ./proxy
func BenchmarkRecording(b *testing.B) {
	up := streamUpstream()
	defer up.Close()
	system := strings.Repeat("You are a helpful assistant. ", 40)
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("record=%v", on), func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Policy = "kv-aware"
			cfg.Backends = []Backend{{URL: up.URL}}
			if on {
				cfg.Record.Path = b.TempDir() + "/rec.jsonl"
			}
			rt, err := New(cfg, Deps{Registry: prometheus.NewRegistry()})
			if err != nil {
				b.Fatal(err)
			}
			defer rt.StopRecording()
			srv := httptest.NewServer(rt.Handler())
			defer srv.Close()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 256, DisableCompression: true}}
			var mu sync.Mutex
			var lat []time.Duration
			var seq atomic.Int64
			b.SetParallelism(max(256/runtime.GOMAXPROCS(0), 1))
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var mine []time.Duration
				for pb.Next() {
					k := seq.Add(1)
					body := fmt.Sprintf(`{"model":"m","stream":true,"max_tokens":8,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`, system, k)
					req, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(body))
					req.Header.Set("X-Session-ID", fmt.Sprint("s", k))
					t0 := time.Now()
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					mine = append(mine, time.Since(t0))
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
			b.StopTimer()
			st := rt.StopRecording()
			slices.Sort(lat)
			q := func(p float64) float64 { return float64(lat[min(int(p*float64(len(lat))), len(lat)-1)].Microseconds()) }
			b.ReportMetric(q(0.5), "p50-µs")
			b.ReportMetric(q(0.99), "p99-µs")
			if on {
				b.ReportMetric(float64(st.Dropped), "dropped")
				if st.Written+st.Dropped != int64(len(lat)) {
					b.Errorf("%d written + %d dropped of %d requests", st.Written, st.Dropped, len(lat))
				}
			}
		})
	}
}

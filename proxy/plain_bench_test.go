//go:build unix

package proxy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	rtmetrics "runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// plainChunks is how many content chunks the plain benchmark's upstream
// streams per request, before the finish chunk, the usage chunk and
// [DONE].
const plainChunks = 64

// plainUpstream answers /v1/chat/completions as an engine would, as fast
// as loopback allows: a streamed request gets plainChunks content chunks
// (each with "usage": null, as OpenAI sends them when the client asks for
// usage), a finish chunk, the usage chunk and [DONE], one flush per chunk;
// any other request gets the whole completion as JSON with its usage.
// Other paths are 404, so that nothing but the requests under test costs
// CPU.
func plainUpstream() *httptest.Server {
	var chunk, tail, whole []byte
	for i := range plainChunks {
		chunk = fmt.Appendf(chunk, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\","+
			"\"choices\":[{\"index\":0,\"delta\":{\"content\":\" tok%d\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n", i)
	}
	usage := `"usage":{"prompt_tokens":300,"total_tokens":364,"completion_tokens":64,"prompt_tokens_details":{"cached_tokens":256}}`
	tail = fmt.Appendf(tail, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\","+
		"\"choices\":[{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}],\"usage\":null}\n\n"+
		"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1700000000,\"model\":\"m\",\"choices\":[],%s}\n\n"+
		"data: [DONE]\n\n", usage)
	whole = fmt.Appendf(whole, `{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"m",`+
		`"choices":[{"index":0,"message":{"role":"assistant","content":%q},"logprobs":null,"finish_reason":"stop"}],%s}`,
		strings.Repeat(" tok", plainChunks), usage)
	events := make([][]byte, 0, plainChunks)
	for rest := chunk; len(rest) > 0; {
		i := strings.Index(string(rest), "\n\n") + 2
		events, rest = append(events, rest[:i]), rest[i:]
	}
	return labeledServer("upstream", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", strconv.Itoa(len(whole)))
			w.Write(whole)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for _, ev := range events {
			w.Write(ev)
			fl.Flush()
		}
		w.Write(tail)
	}))
}

// labeledServer starts a loopback server of h whose goroutines carry the
// profiler label role=role, so that a CPU profile of the benchmark
// (-cpuprofile) splits by role: go tool pprof -tagfocus=role=kvrouter.
func labeledServer(role string, h http.Handler) *httptest.Server {
	s := httptest.NewUnstartedServer(h)
	pprof.Do(context.Background(), pprof.Labels("role", role), func(context.Context) { s.Start() })
	return s
}

// processAllocs returns the heap allocations (objects and bytes) of this
// process so far.
func processAllocs() (objects, bytes uint64) {
	s := []rtmetrics.Sample{{Name: "/gc/heap/allocs:objects"}, {Name: "/gc/heap/allocs:bytes"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64()
}

// processCPU returns the CPU time (user and system) of this process so
// far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkProxyVsPlain measures the CPU kvrouter spends per request
// against a plain httputil.ReverseProxy (Rewrite to one upstream, the
// same transport settings as the router's, nothing else), over the same
// loopback upstream, streamed (64 chunks, the finish chunk, usage and
// [DONE], one flush each) and not, at 16 and 256 concurrent clients.
// Streamed requests ask for usage (stream_options.include_usage), so
// kvrouter injects and strips nothing and every target moves the same
// bytes.
// kvrouter routes kv-aware over 8 upstreams (8 listeners of the same
// handler) and writes its access log (text, to io.Discard); its
// background loops (scraping, health, the dashboard's history) are not
// running, as their cost does not depend on requests.
//
// Everything runs in this process, so CPU is attributed by rounds: each
// round sends 4 requests per client (closed loop) to one target, and the
// targets alternate: direct (client to upstream, no proxy), plain,
// kvrouter. A round's CPU is the process's (getrusage RUSAGE_SELF, user
// and system) across it. The direct rounds cost what the client and the
// upstream cost for the same requests and bytes, so a proxy's CPU per
// request is its rounds' CPU per request less the direct rounds'. Other
// work on the machine is not counted, but makes every request dearer
// (cache misses, context switches) for all three targets alike, so
// compare ratios within one run. b.N is the requests per target. Every goroutine
// carries the profiler label role (client, upstream, plain, kvrouter), so
// that a -cpuprofile of it shows one proxy alone
// (go tool pprof -tagfocus=role=kvrouter):
//
//	go test -run='^$' -bench=ProxyVsPlain -benchtime=6000x -count=5 ./proxy
//
// reports direct-, plain- and kvrouter-cpu-µs/req and ratio (kvrouter
// over plain), and the heap allocations per request of each proxy
// (plain-, kvrouter-allocs/req and -B/req, less the direct rounds' as
// CPU is), which do not depend on the machine's load. Budget: ratio ≤
// 1.3 streamed, ≤ 1.2 not.
func BenchmarkProxyVsPlain(b *testing.B) {
	var ups []*httptest.Server
	for range 8 {
		up := plainUpstream()
		defer up.Close()
		ups = append(ups, up)
	}
	cfg := DefaultConfig()
	cfg.Policy = "kv-aware"
	for _, up := range ups {
		cfg.Backends = append(cfg.Backends, Backend{URL: up.URL})
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rt, err := New(cfg, Deps{Registry: prometheus.NewRegistry(), Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	kv := labeledServer("kvrouter", rt.Handler())
	defer kv.Close()
	target, _ := url.Parse(ups[0].URL)
	rp := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport: newTransport(&cfg),
	}
	// Full duplex: otherwise the server may close the request body when
	// the response starts while the transport still reads its end, and
	// the upstream connection breaks mid-stream (kvrouter reads the body
	// before it sends it, so it never meets this).
	plain := labeledServer("plain", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		rp.ServeHTTP(w, r)
	}))
	defer plain.Close()
	system := strings.Repeat("You are a helpful assistant. ", 40)
	for _, streamed := range []bool{true, false} {
		for _, conc := range []int{16, 256} {
			b.Run(fmt.Sprintf("stream=%v/c=%d", streamed, conc), func(b *testing.B) {
				targets := []string{ups[0].URL, plain.URL, kv.URL}
				names := []string{"direct", "plain", "kvrouter"}
				clients := make([]*http.Client, len(targets))
				for i := range clients {
					clients[i] = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conc, DisableCompression: true}}
					defer clients[i].CloseIdleConnections()
				}
				opts := ""
				if streamed {
					opts = `"stream":true,"stream_options":{"include_usage":true},`
				}
				var seq int
				client := pprof.WithLabels(context.Background(), pprof.Labels("role", "client"))
				send := func(t int, k int) error {
					body := fmt.Sprintf(`{"model":"m",%s"max_tokens":64,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`,
						opts, system, k)
					resp, err := clients[t].Post(targets[t]+"/v1/chat/completions", "application/json", strings.NewReader(body))
					if err != nil {
						return fmt.Errorf("%s: %w", names[t], err)
					}
					n, err := io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err != nil || resp.StatusCode != 200 || n == 0 {
						return fmt.Errorf("%s: status %d, %d bytes, %v", names[t], resp.StatusCode, n, err)
					}
					return nil
				}
				// round sends 4 requests per client to target t and returns
				// the process's CPU across them; it adds the heap
				// allocations across them to allocs[t].
				var allocs [3][2]uint64
				round := func(t int) time.Duration {
					var wg sync.WaitGroup
					errs := make(chan error, conc)
					o0, b0 := processAllocs()
					t0 := processCPU(b)
					for w := range conc {
						base := seq + 4*w
						wg.Go(func() {
							pprof.SetGoroutineLabels(client)
							for k := range 4 {
								if err := send(t, base+k); err != nil {
									errs <- err
									return
								}
							}
						})
					}
					wg.Wait()
					spent := processCPU(b) - t0
					o1, b1 := processAllocs()
					allocs[t][0] += o1 - o0
					allocs[t][1] += b1 - b0
					seq += 4 * conc
					close(errs)
					for err := range errs {
						b.Fatal(err)
					}
					return spent
				}
				for t := range targets { // warm the connection pools
					round(t)
				}
				allocs = [3][2]uint64{}
				var cpu [3]time.Duration
				reqs := 0
				b.ResetTimer()
				for r := 0; reqs < b.N; r++ {
					for i := range targets {
						t := (i + r) % len(targets) // rotate which target follows which
						cpu[t] += round(t)
					}
					reqs += 4 * conc
				}
				b.StopTimer()
				per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(reqs) }
				direct, viaPlain, viaKV := per(cpu[0]), per(cpu[1])-per(cpu[0]), per(cpu[2])-per(cpu[0])
				b.ReportMetric(direct, "direct-cpu-µs/req")
				b.ReportMetric(viaPlain, "plain-cpu-µs/req")
				b.ReportMetric(viaKV, "kvrouter-cpu-µs/req")
				b.ReportMetric(viaKV/viaPlain, "ratio")
				perReq := func(t, k int) float64 { return (float64(allocs[t][k]) - float64(allocs[0][k])) / float64(reqs) }
				b.ReportMetric(perReq(1, 0), "plain-allocs/req")
				b.ReportMetric(perReq(2, 0), "kvrouter-allocs/req")
				b.ReportMetric(perReq(1, 1), "plain-B/req")
				b.ReportMetric(perReq(2, 1), "kvrouter-B/req")
			})
		}
	}
}

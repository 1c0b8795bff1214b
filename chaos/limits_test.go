package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/proxy"
)

// Bounds the limit tests assert, over the router's memory before the
// attack.
const (
	maxRSSGrowth  = 100 << 20
	maxHeapGrowth = 100 << 20
)

// errCode returns the OpenAI error code of an error body, or "".
func errCode(body []byte) string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	json.Unmarshal(body, &e)
	return e.Error.Code
}

// peakRSS samples p's RSS every 5 ms while f runs and returns the largest.
func peakRSS(p *proc, f func()) int64 {
	done := make(chan struct{})
	var peak atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			if r := p.RSS(); r > peak.Load() {
				peak.Store(r)
			}
			select {
			case <-done:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	})
	f()
	close(done)
	wg.Wait()
	return max(peak.Load(), p.RSS())
}

// warmUp sends a few ordinary requests, so that the baseline RSS includes a
// router that has served.
func warmUp(t *testing.T, url string) {
	t.Helper()
	for i := range 5 {
		resp, err := post(context.Background(), t, url, "/v1/chat/completions", chat(fmt.Sprint("warm up ", i), 4, false))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("warm-up request: status %d", resp.StatusCode)
		}
	}
}

// TestEmptyMessagesBounded: an 8 MB body of empty messages (2.7M of them)
// drove the router's RSS to 1.04 GB, three in parallel to 2.47 GB. Now it
// is answered 400 too_many_messages and the RSS stays within 100 MB of
// where it was.
func TestEmptyMessagesBounded(t *testing.T) {
	rt := startRouter(t, []*proc{startEngine(t, "--time-scale", "0.01")})
	waitReady(t, rt.URL(), "/health", 10*time.Second)
	warmUp(t, rt.URL())
	body := emptyMessages(proxy.DefaultMaxBodyBytes)
	rounds := 3
	if *long {
		rounds = 30
	}
	base := rt.RSS()
	peak := peakRSS(rt, func() {
		for range rounds {
			var wg sync.WaitGroup
			for range 3 {
				wg.Go(func() {
					resp, err := post(context.Background(), t, rt.URL(), "/v1/chat/completions", body)
					if err != nil {
						t.Error(err)
						return
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusBadRequest || errCode(b) != "too_many_messages" {
						t.Errorf("got %d %s, want 400 too_many_messages", resp.StatusCode, b)
					}
				})
			}
			wg.Wait()
		}
	})
	t.Logf("%d rounds of 3 parallel %d-byte bodies of empty messages: RSS %d MB before, peak %d MB (+%d MB)",
		rounds, len(body), base>>20, peak>>20, (peak-base)>>20)
	if peak-base > maxRSSGrowth {
		t.Errorf("RSS grew by %d MB, want at most %d MB", (peak-base)>>20, maxRSSGrowth>>20)
	}
	if got := metric(t, rt.AdminURL(), `kvrouter_errors_total{code="too_many_messages"}`); got != float64(3*rounds) {
		t.Errorf("kvrouter_errors_total{code=too_many_messages} = %v, want %d", got, 3*rounds)
	}
}

// emptyMessages is a chat body of at most size bytes of empty messages.
func emptyMessages(size int) []byte {
	const head, tail = `{"model":"emulated","messages":[`, `]}`
	var b bytes.Buffer
	b.WriteString(head)
	for i := 0; b.Len()+3+len(tail) <= size; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("{}")
	}
	b.WriteString(tail)
	return b.Bytes()
}

// inProcessRouter runs a router in this process (proxy.New, NewServer on
// a real listener) in front of engines, for tests that measure its heap.
// It returns the router's URL and a count of its connections that reached
// http.StateActive (a request header read).
func inProcessRouter(t *testing.T, engines []*proc, mod func(*proxy.Config)) (string, *atomic.Int64) {
	t.Helper()
	cfg := proxy.DefaultConfig()
	for _, e := range engines {
		cfg.Backends = append(cfg.Backends, proxy.Backend{URL: e.URL()})
	}
	cfg.HealthInterval, cfg.ScrapeInterval = 100*time.Millisecond, 100*time.Millisecond
	if mod != nil {
		mod(&cfg)
	}
	rt, err := proxy.New(cfg, proxy.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { rt.Run(ctx) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := rt.NewServer()
	active := new(atomic.Int64)
	state := srv.ConnState
	srv.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateActive {
			active.Add(1)
		}
		state(c, s)
	}
	wg.Go(func() { srv.Serve(ln) })
	t.Cleanup(func() {
		srv.Close()
		cancel()
		wg.Wait()
	})
	url := "http://" + ln.Addr().String()
	waitReady(t, url, "/health", 10*time.Second)
	return url, active
}

// heapAlloc returns the live heap after a collection, in bytes.
func heapAlloc() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// dialN opens n connections to url's host, at most 64 dials at a time.
func dialN(t *testing.T, url string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, n)
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range conns {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			c, err := net.DialTimeout("tcp", strings.TrimPrefix(url, "http://"), 10*time.Second)
			if err != nil {
				failed.Add(1)
				return
			}
			conns[i] = c
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	})
	if f := failed.Load(); f > 0 {
		t.Fatalf("%d of %d dials failed", f, n)
	}
	return conns
}

// slowBodyHeader is a request header declaring an 8 MB body.
const slowBodyHeader = "POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: 8000000\r\n\r\n"

// TestSlowDeclaredBodiesHeap: 300 slow connections each declaring an 8 MB
// body reserved 2.46 GB (the buffer was sized from Content-Length). Now
// the buffers grow as bytes arrive: the router's heap grows by less than
// 100 MB while they trickle.
func TestSlowDeclaredBodiesHeap(t *testing.T) {
	url, active := inProcessRouter(t, []*proc{startEngine(t, "--time-scale", "0.01")}, nil)
	const n = 300
	base, active0 := heapAlloc(), active.Load()
	conns := dialN(t, url, n)
	chunk := []byte(`{"model":"emulated","messages":[{"role":"user","content":"` + strings.Repeat("x", 1000))
	for _, c := range conns {
		if _, err := io.WriteString(c, slowBodyHeader); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	wait.For(t, fmt.Sprintf("the %d requests at the router", n), func() bool { return active.Load()-active0 >= n })
	var peak int64
	for range 20 { // the handlers are reading: sample the heap as they do
		peak = max(peak, heapAlloc())
		time.Sleep(10 * time.Millisecond) // the sampling interval
	}
	t.Logf("%d connections declaring 8 MB, 1 KB sent: heap %d MB before, %d MB while they trickle (+%d MB)",
		n, base>>20, peak>>20, (peak-base)>>20)
	if peak-base > maxHeapGrowth {
		t.Errorf("heap grew by %d MB, want at most %d MB", (peak-base)>>20, maxHeapGrowth>>20)
	}
}

// awaitClosed waits up to within for every connection to be closed by
// the router (a read returns EOF or an error other than a timeout) and
// returns how many are still open, and how long the last one took.
func awaitClosed(conns []net.Conn, within time.Duration) (open int, last time.Duration) {
	start := time.Now()
	var wg sync.WaitGroup
	var stillOpen atomic.Int64
	var lastNs atomic.Int64
	for _, c := range conns {
		wg.Go(func() {
			c.SetReadDeadline(start.Add(within))
			_, err := io.Copy(io.Discard, c)
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				stillOpen.Add(1)
				return
			}
			for d := int64(time.Since(start)); ; {
				cur := lastNs.Load()
				if d <= cur || lastNs.CompareAndSwap(cur, d) {
					break
				}
			}
		})
	}
	wg.Wait()
	return int(stillOpen.Load()), time.Duration(lastNs.Load())
}

// TestIdleConnectionsClosed: 0 of 2,000 idle keep-alive connections were
// closed. Now each is closed after --idle-timeout.
func TestIdleConnectionsClosed(t *testing.T) {
	rt := startRouter(t, []*proc{startEngine(t, "--time-scale", "0.01")}, "--idle-timeout", "1s")
	waitReady(t, rt.URL(), "/health", 10*time.Second)
	const n = 2000
	conns := dialN(t, rt.URL(), n)
	var wg sync.WaitGroup
	var bad atomic.Int64
	for _, c := range conns {
		wg.Go(func() {
			c.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(c, "GET /health HTTP/1.1\r\nHost: router\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != http.StatusOK || resp.Close {
				bad.Add(1)
				return
			}
			resp.Body.Close()
			c.SetDeadline(time.Time{})
		})
	}
	wg.Wait()
	if b := bad.Load(); b > 0 {
		t.Fatalf("%d of %d keep-alive requests failed", b, n)
	}
	open, last := awaitClosed(conns, 10*time.Second)
	t.Logf("%d idle keep-alive connections, --idle-timeout 1s: %d still open after 10 s, the last closed after %v", n, open, last)
	if open > 0 {
		t.Errorf("%d of %d idle connections still open after 10 s, want 0", open, n)
	}
}

// TestSlowBodyConnectionsClosed: 2,000 slow-body connections were still
// open after 60 s. Now each gets 408 body_timeout and is closed after
// --body-timeout. The bodies they declare (16 GB) are within a body
// budget raised to hold them all: past the default one, most would get
// 503 body_budget_exhausted before being read (TestBodyBudget in proxy),
// and this test is about the ones that are read.
func TestSlowBodyConnectionsClosed(t *testing.T) {
	rt := startRouter(t, []*proc{startEngine(t, "--time-scale", "0.01")}, "--body-timeout", "1s", "--max-body-bytes-total", "17000000000")
	waitReady(t, rt.URL(), "/health", 10*time.Second)
	const n = 2000
	conns := dialN(t, rt.URL(), n)
	start := time.Now()
	var wg sync.WaitGroup
	var timedOut, open atomic.Int64
	for _, c := range conns {
		wg.Go(func() {
			c.SetDeadline(time.Now().Add(15 * time.Second))
			io.WriteString(c, slowBodyHeader+`{"model":`)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				open.Add(1)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode == http.StatusRequestTimeout && errCode(b) == "body_timeout" {
				timedOut.Add(1)
			}
			if _, err := br.ReadByte(); err != io.EOF {
				open.Add(1)
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	t.Logf("%d slow-body connections, --body-timeout 1s: %d answered 408 body_timeout, %d not closed, all done in %v",
		n, timedOut.Load(), open.Load(), took)
	if timedOut.Load() != n || open.Load() != 0 {
		t.Errorf("%d of %d answered 408 body_timeout and %d left open, want all answered and closed", timedOut.Load(), n, open.Load())
	}
	if got := metric(t, rt.AdminURL(), `kvrouter_errors_total{code="body_timeout"}`); got != n {
		t.Errorf("kvrouter_errors_total{code=body_timeout} = %v, want %d", got, n)
	}
}

// TestLongSessionIDsBounded: 400 requests with 900 KB session ids took
// 546 MB (ids kept verbatim for --session-ttl, in the session table and
// the decision records). Now long ids are kept as a fixed-size hash: 150
// requests (400 with -chaos.long) grow the RSS by less than 100 MB.
func TestLongSessionIDsBounded(t *testing.T) {
	rt := startRouter(t, []*proc{startEngine(t, "--time-scale", "0.01")})
	waitReady(t, rt.URL(), "/health", 10*time.Second)
	warmUp(t, rt.URL())
	const size = 900 << 10
	n := 150 // 205 MB of ids before
	if *long {
		n = 400
	}
	base := rt.RSS()
	peak := peakRSS(rt, func() {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 4)
		for i := range n {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				id := fmt.Sprintf("%06d", i) + strings.Repeat("s", size)
				body := fmt.Appendf(nil, `{"model":"emulated","user":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`, id)
				resp, err := post(context.Background(), t, rt.URL(), "/v1/chat/completions", body)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Errorf("status %d, want 200", resp.StatusCode)
				}
			})
		}
		wg.Wait()
	})
	sessions := metric(t, rt.AdminURL(), "kvrouter_sessions")
	t.Logf("%d requests with %d KB session ids: RSS %d MB before, peak %d MB (+%d MB); %v sessions bound",
		n, size>>10, base>>20, peak>>20, (peak-base)>>20, sessions)
	if peak-base > maxRSSGrowth {
		t.Errorf("RSS grew by %d MB, want at most %d MB", (peak-base)>>20, maxRSSGrowth>>20)
	}
	if sessions < float64(n) {
		t.Errorf("%v sessions bound, want at least %d (one per id)", sessions, n)
	}
}

// TestHugeHeadersRejected: a 1 MiB header and 10,000 headers were
// accepted and forwarded. Now both get 431 and are counted.
func TestHugeHeadersRejected(t *testing.T) {
	rt := startRouter(t, []*proc{startEngine(t, "--time-scale", "0.01")})
	waitReady(t, rt.URL(), "/health", 10*time.Second)
	var many strings.Builder
	for range 10000 {
		many.WriteString("A: b\r\n")
	}
	for _, tc := range []struct {
		name, header, code string
	}{
		{"1 MiB header", "X-Big: " + strings.Repeat("x", 1<<20) + "\r\n", ""},
		{"10,000 headers", many.String(), "too_many_headers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialN(t, rt.URL(), 1)[0]
			c.SetDeadline(time.Now().Add(10 * time.Second))
			body := chat("hi", 1, false)
			req := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s",
				len(body), tc.header, body)
			go io.WriteString(c, req) // the router may answer before reading it all
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || tc.code != "" && errCode(b) != tc.code {
				t.Errorf("got %d %.200s, want 431 %s", resp.StatusCode, b, tc.code)
			}
		})
	}
	// net/http closes the connection of a header too large some 500 ms
	// after its answer; the count follows the close.
	wait.For(t, "kvrouter_header_rejected_total 1 (the 1 MiB header)", func() bool { return metric(t, rt.AdminURL(), "kvrouter_header_rejected_total") == 1 })
	if got := metric(t, rt.AdminURL(), `kvrouter_errors_total{code="too_many_headers"}`); got != 1 {
		t.Errorf("kvrouter_errors_total{code=too_many_headers} = %v, want 1", got)
	}
	if got := metricSum(t, rt.AdminURL(), "kvrouter_requests_total"); got != 0 {
		t.Errorf("requests routed: %v, want 0", got)
	}
}

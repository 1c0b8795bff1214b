package discover

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/proxy"
)

// TestRouterFollowsDNS runs a real router whose backends come from SRV
// records on a DNS server on loopback: two emulated engines are found and
// served; when one vanishes from DNS, it gets no new request, its stream
// in flight finishes, and it is removed.
func TestRouterFollowsDNS(t *testing.T) {
	var engines []*emulator.Server
	z := newZone()
	var srv []string
	for i := range 2 {
		s, err := emulator.Start(emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: 1}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		engines = append(engines, s)
		port := s.URL()[strings.LastIndexByte(s.URL(), ':')+1:]
		pod := fmt.Sprintf("pod-%d.vllm.llm.svc", i)
		z.set(pod, "A 127.0.0.1")
		srv = append(srv, "SRV 0 50 "+port+" "+pod+".")
	}
	z.set("_http._tcp.vllm.llm.svc", srv...)

	cfg := proxy.DefaultConfig()
	cfg.ClientHeaders = true // the test reads X-Kvrouter-Replica
	cfg.Policy, cfg.Listen = "round-robin", "127.0.0.1:0"
	cfg.Discover = "dns+srv://_http._tcp.vllm.llm.svc"
	rt, err := proxy.New(cfg, proxy.Deps{Registry: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(rt.Handler())
	t.Cleanup(api.Close)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // after cancel: cleanups run last first
	t.Cleanup(cancel)
	wg.Go(func() { rt.Run(ctx) })
	tg, err := Parse(cfg.Discover)
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{Target: tg, Interval: 20 * time.Millisecond, Resolver: startDNS(t, z), OnChange: setBackends(t, rt)})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { d.Run(ctx) })

	a, b := engines[0].URL(), engines[1].URL()
	wait.For(t, "two backends", func() bool { return len(rt.Backends()) == 2 })
	if got := spread(t, api.URL, 6); got[a] != 3 || got[b] != 3 {
		t.Errorf("requests over the discovered backends: %v, want 3 on each", got)
	}
	// A stream on pod-1, then pod-1 leaves DNS.
	resp, br := streamOn(t, api.URL, b)
	z.set("_http._tcp.vllm.llm.svc", srv[0])
	wait.For(t, "the backend removed", func() bool {
		for _, s := range rt.Backends() {
			if s.URL == b {
				return s.State == "removed"
			}
		}
		return false
	})
	if got := spread(t, api.URL, 4); got[a] != 4 {
		t.Errorf("after pod-1 left DNS: %v, want every request on pod-0", got)
	}
	rest, err := io.ReadAll(br)
	resp.Body.Close()
	if err != nil || !strings.Contains(string(rest), "data: [DONE]") {
		t.Errorf("the stream on the vanished backend: %v, ended without [DONE]", err)
	}
	wait.For(t, "one backend", func() bool { return len(rt.Backends()) == 1 })
}

// setBackends is an OnChange that applies each list to rt, as serve's
// discovery does.
func setBackends(t *testing.T, rt *proxy.Router) func([]string) {
	return func(urls []string) {
		bes := make([]proxy.Backend, len(urls))
		for i, u := range urls {
			bes[i] = proxy.Backend{URL: u}
		}
		if err := rt.SetBackends(bes, proxy.SourceDiscover); err != nil {
			t.Errorf("SetBackends: %v", err)
		}
	}
}

// spread sends n short requests and counts them per replica.
func spread(t *testing.T, url string, n int) map[string]int {
	t.Helper()
	out := map[string]int{}
	for i := range n {
		body := `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"q` + strconv.Itoa(i) + `"}]}`
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		out[resp.Header.Get(proxy.HeaderReplica)]++
	}
	return out
}

// streamOn opens long streams until one is served by replica, and
// returns it after its first event.
func streamOn(t *testing.T, url, replica string) (*http.Response, *bufio.Reader) {
	t.Helper()
	for range 10 {
		body := `{"model":"m","stream":true,"max_tokens":150,"messages":[{"role":"user","content":"tell me"}]}`
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		if resp.Header.Get(proxy.HeaderReplica) == replica {
			return resp, br
		}
		io.Copy(io.Discard, br)
		resp.Body.Close()
	}
	t.Fatalf("no stream reached %s", replica)
	return nil, nil
}

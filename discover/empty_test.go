package discover

import (
	"cmp"
	"context"
	"encoding/json"
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
	"github.com/kvrouter/kvrouter/internal/kubeapi"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/proxy"
)

// TestEmptyFleetIs503NoReplica: under every discovery a fleet that
// discovery emptied (the name gone from DNS, NXDOMAIN; every SRV record
// gone; every pod of the selector deleted; the InferencePool deleted),
// and a router whose last configured backend was removed, answer a completion and
// /v1/models 503 no_replica with Retry-After (after holding the request
// for --ttft-timeout), never 404 model_not_found.
func TestEmptyFleetIs503NoReplica(t *testing.T) {
	eng, err := emulator.Start(emulator.Config{Model: "m", TimeScale: 0.01}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Close() })
	port := eng.URL()[strings.LastIndexByte(eng.URL(), ':')+1:]
	portN, _ := strconv.Atoi(port)
	vllm := map[string]string{"app.kubernetes.io/name": "vllm"}
	for _, tc := range []struct {
		target string
		fill   func(z *zone, api *kubeapi.Server)
		empty  func(z *zone, api *kubeapi.Server)
	}{
		{"", nil, nil},
		{"dns://vllm.llm.svc:" + port,
			func(z *zone, _ *kubeapi.Server) { z.set("vllm.llm.svc", "A 127.0.0.1") },
			func(z *zone, _ *kubeapi.Server) { z.drop("vllm.llm.svc") }},
		{"dns+srv://_http._tcp.vllm.llm.svc",
			func(z *zone, _ *kubeapi.Server) {
				z.set("pod-0.vllm.llm.svc", "A 127.0.0.1")
				z.set("_http._tcp.vllm.llm.svc", "SRV 0 50 "+port+" pod-0.vllm.llm.svc.")
			},
			func(z *zone, _ *kubeapi.Server) { z.drop("_http._tcp.vllm.llm.svc") }},
		{"k8s://llm/app.kubernetes.io/name=vllm?port=" + port,
			func(_ *zone, api *kubeapi.Server) {
				api.Put(podsPath, kubePod("vllm-0", "127.0.0.1", true, vllm))
			},
			func(_ *zone, api *kubeapi.Server) { api.Delete(podsPath, "vllm-0") }},
		{"inferencepool://llm/vllm",
			func(_ *zone, api *kubeapi.Server) {
				api.Put(podsPath, kubePod("vllm-0", "127.0.0.1", true, vllm))
				api.Put(poolsPath, kubePool(vllm, portN))
			},
			func(_ *zone, api *kubeapi.Server) { api.Delete(poolsPath, "vllm") }},
	} {
		name := cmp.Or(tc.target, "static, the last removed")
		t.Run(name, func(t *testing.T) {
			cfg := proxy.DefaultConfig()
			cfg.Listen, cfg.Discover = "127.0.0.1:0", tc.target
			if tc.target == "" {
				cfg.Backends = []proxy.Backend{{URL: eng.URL()}}
			}
			cfg.TTFTTimeout = 50 * time.Millisecond // how long a request waits for a replica before its 503
			z := newZone()
			api, kc := startAPI(t) // before the router: its Close waits for the watches the router's end stops
			rt, front, ctx, wg := runRouter(t, cfg)
			if tc.target != "" {
				tc.fill(z, api)
				tg, err := Parse(tc.target)
				if err != nil {
					t.Fatal(err)
				}
				d, err := New(Config{Target: tg, Interval: 20 * time.Millisecond, Resolver: startDNS(t, z), Kube: kc, OnChange: setBackends(t, rt)})
				if err != nil {
					t.Fatal(err)
				}
				wg.Go(func() { d.Run(ctx) })
				wait.For(t, "the engine discovered", func() bool { return len(rt.Backends()) == 1 })
				if st := completionStatus(t, front.URL); st != 200 {
					t.Fatalf("a completion on the discovered engine: %d", st)
				}
				tc.empty(z, api)
			} else {
				if _, err := rt.RemoveBackend(eng.URL(), proxy.SourceAdmin); err != nil {
					t.Fatal(err)
				}
			}
			wait.For(t, "no backend left", func() bool { return len(rt.Backends()) == 0 })
			for _, path := range []string{"/v1/chat/completions", "/v1/models"} {
				code, retry, status := errorOf(t, front.URL, path)
				if status != http.StatusServiceUnavailable || code != "no_replica" || retry == "" {
					t.Errorf("%s on an empty fleet: %d %q (Retry-After %q), want 503 no_replica with Retry-After", path, status, code, retry)
				}
			}
		})
	}
}

func completionStatus(t *testing.T, url string) int {
	_, _, status := errorOf(t, url, "/v1/chat/completions")
	return status
}

// errorOf sends a completion (a POST) or a GET to path and returns the
// error's code, the Retry-After header and the status.
func errorOf(t *testing.T, url, path string) (code, retryAfter string, status int) {
	t.Helper()
	var resp *http.Response
	var err error
	if path == "/v1/chat/completions" {
		body := `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
		resp, err = http.Post(url+path, "application/json", strings.NewReader(body))
	} else {
		resp, err = http.Get(url + path)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	json.Unmarshal(b, &e)
	return e.Error.Code, resp.Header.Get("Retry-After"), resp.StatusCode
}

// runRouter runs a router on cfg behind a loopback front until the test
// ends, and returns it, the front, and the context and WaitGroup of its
// goroutines for the test's own (a discoverer). Start a loopback API
// server before it: cleanups run last first, and the server's Close
// waits for the watches that the end of ctx stops.
func runRouter(t *testing.T, cfg proxy.Config) (*proxy.Router, *httptest.Server, context.Context, *sync.WaitGroup) {
	t.Helper()
	rt, err := proxy.New(cfg, proxy.Deps{Registry: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(rt.Handler())
	t.Cleanup(front.Close)
	ctx, cancel := context.WithCancel(context.Background())
	wg := &sync.WaitGroup{}
	t.Cleanup(wg.Wait)
	t.Cleanup(cancel)
	wg.Go(func() { rt.Run(ctx) })
	return rt, front, ctx, wg
}

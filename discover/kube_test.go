package discover

import (
	"context"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/internal/kubeapi"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/kube"
	"github.com/kvrouter/kvrouter/proxy"
)

var (
	podsPath  = kubeapi.PodsPath("llm")
	poolsPath = kubeapi.PoolsPath("llm")
)

func kubePod(name, ip string, ready bool, labels map[string]string) any {
	return kubeapi.Pod(name, ip, ready, labels)
}

func kubePool(labels map[string]string, port int) map[string]any {
	return kubeapi.Pool("vllm", labels, port)
}

// startAPI serves a loopback Kubernetes API and returns it and a client.
func startAPI(t *testing.T) (*kubeapi.Server, *kube.Client) {
	api := kubeapi.New()
	ks := httptest.NewServer(api)
	t.Cleanup(ks.Close)
	kc, err := kube.New(kube.Config{Server: ks.URL})
	if err != nil {
		t.Fatal(err)
	}
	return api, kc
}

// enginesOnOnePort starts two emulated engines on 127.0.0.1 and
// 127.0.0.2 with the same port, as two pods of a pool serve on one
// target port, and returns them and the port.
func enginesOnOnePort(t *testing.T) ([2]*emulator.Server, int) {
	cfg := emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: 1}
	for range 20 {
		a, err := emulator.Start(cfg, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := a.URL()[strings.LastIndexByte(a.URL(), ':')+1:]
		b, err := emulator.Start(cfg, "127.0.0.2:"+port)
		if err != nil { // the port is taken on 127.0.0.2: another
			a.Close()
			continue
		}
		t.Cleanup(func() { a.Close(); b.Close() })
		p, _ := strconv.Atoi(port)
		return [2]*emulator.Server{a, b}, p
	}
	t.Skip("no port free on both 127.0.0.1 and 127.0.0.2")
	return [2]*emulator.Server{}, 0
}

// TestRouterFollowsInferencePool runs a real router whose backends are an
// InferencePool's ready pods, watched through a loopback Kubernetes API
// (internal/kubeapi): pod b becomes ready and is served, the pool's
// selector changes to leave pod a out and a is removed.
func TestRouterFollowsInferencePool(t *testing.T) {
	engines, port := enginesOnOnePort(t)
	api, kc := startAPI(t)
	api.Put(podsPath, kubePod("a", "127.0.0.1", true, map[string]string{"app": "vllm", "shard": "1"}))
	api.Put(podsPath, kubePod("b", "127.0.0.2", false, map[string]string{"app": "vllm", "shard": "2"}))
	api.Put(poolsPath, kubePool(map[string]string{"app": "vllm"}, port))

	cfg := proxy.DefaultConfig()
	cfg.Policy, cfg.Listen = "round-robin", "127.0.0.1:0"
	cfg.ClientHeaders = true // spread reads X-Kvrouter-Replica
	cfg.Discover = "inferencepool://llm/vllm"
	rt, front, ctx, wg := runRouter(t, cfg)
	tg, err := Parse(cfg.Discover)
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{Target: tg, Kube: kc, OnChange: setBackends(t, rt)})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { d.Run(ctx) })

	a, b := engines[0].URL(), engines[1].URL()
	live := func() map[string]bool {
		out := map[string]bool{}
		for _, s := range rt.Backends() {
			if s.State != "removed" && s.State != "draining" {
				out[s.URL] = true
			}
		}
		return out
	}
	wait.For(t, "pod a only", func() bool { l := live(); return len(l) == 1 && l[a] })
	api.Put(podsPath, kubePod("b", "127.0.0.2", true, map[string]string{"app": "vllm", "shard": "2"}))
	wait.For(t, "pods a and b", func() bool { l := live(); return len(l) == 2 && l[a] && l[b] })
	if got := spread(t, front.URL, 6); got[a] != 3 || got[b] != 3 {
		t.Errorf("requests over the pool's pods: %v, want 3 on each", got)
	}
	api.Put(poolsPath, kubePool(map[string]string{"app": "vllm", "shard": "2"}, port))
	wait.For(t, "pod b only", func() bool { l := live(); return len(l) == 1 && l[b] })
	if got := spread(t, front.URL, 3); got[b] != 3 {
		t.Errorf("after the pool's selector left pod a out: %v, want every request on b", got)
	}
}

// TestLabelSelectorTarget: a k8s:// target with docs/kubernetes.md's
// prefixed key and a set-based term reports its ready pods' URLs with the
// target's scheme and port, and each list counts as a resolution; a
// Kubernetes target without a client is refused.
func TestLabelSelectorTarget(t *testing.T) {
	api, kc := startAPI(t)
	vllm := map[string]string{"app.kubernetes.io/name": "vllm"}
	api.Put(podsPath, kubePod("a", "10.0.0.1", true, vllm))
	api.Put(podsPath, kubePod("b", "10.0.0.2", true, map[string]string{"app.kubernetes.io/name": "web"}))
	api.Put(podsPath, kubePod("d", "10.0.0.4", true, map[string]string{"app.kubernetes.io/name": "vllm", "canary": "true"}))
	tg, err := Parse("k8s://llm/app.kubernetes.io/name in (vllm),!canary?port=8443&scheme=https")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Target: tg, OnChange: func([]string) {}}); err == nil {
		t.Error("a Kubernetes target without a client: no error")
	}
	var rec recorder
	var mu sync.Mutex
	resolved := 0
	d, err := New(Config{Target: tg, Kube: kc, OnChange: rec.onChange, OnResolve: func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			resolved++
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { d.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	wait.For(t, "the first list", func() bool { return len(rec.all()) == 1 })
	api.Put(podsPath, kubePod("c", "10.0.0.3", true, vllm))
	wait.For(t, "pod c", func() bool { return len(rec.all()) == 2 })
	want := [][]string{{"https://10.0.0.1:8443"}, {"https://10.0.0.1:8443", "https://10.0.0.3:8443"}}
	if got := rec.all(); !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("lists %q, want %q", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if resolved != 2 {
		t.Errorf("resolutions ok: %d, want 2", resolved)
	}
}

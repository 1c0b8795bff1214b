package kube_test

import (
	"context"
	"maps"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/kubeapi"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/kube"
)

var (
	podsPath  = kubeapi.PodsPath("llm")
	poolsPath = kubeapi.PoolsPath("llm")
	newPod    = kubeapi.Pod
	newPool   = kubeapi.Pool
)

// recorder keeps the endpoint lists a follower reported.
type recorder struct {
	mu   sync.Mutex
	last []string
	n    int
	ch   chan struct{}
}

func newRecorder() *recorder { return &recorder{ch: make(chan struct{}, 1)} }

func (r *recorder) set(eps []string) {
	r.mu.Lock()
	r.last, r.n = eps, r.n+1
	r.mu.Unlock()
	select {
	case r.ch <- struct{}{}:
	default:
	}
}

// await waits for the endpoints to be want.
func (r *recorder) await(t *testing.T, what string, want ...string) {
	t.Helper()
	if want == nil {
		want = []string{}
	}
	deadline := time.After(5 * time.Second)
	for {
		r.mu.Lock()
		got := r.last
		r.mu.Unlock()
		if got != nil && slices.Equal(got, want) {
			return
		}
		select {
		case <-r.ch:
		case <-deadline:
			t.Fatalf("%s: endpoints %q, want %q", what, got, want)
		}
	}
}

func start(t *testing.T) (*kubeapi.Server, *kube.Client) {
	api := kubeapi.New()
	api.BookmarkEvery = 20 * time.Millisecond
	ts := httptest.NewServer(api)
	t.Cleanup(ts.Close)
	c, err := kube.New(kube.Config{Server: ts.URL})
	if err != nil {
		t.Fatal(err)
	}
	return api, c
}

func run(t *testing.T, f func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { f(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// TestFollowPods follows pods by label selector through list and watch:
// readiness, deletion, a pod of another label, a dropped watch and a 410
// after compaction.
func TestFollowPods(t *testing.T) {
	api, c := start(t)
	vllm := map[string]string{"app": "vllm"}
	api.Put(podsPath, newPod("a", "10.0.0.1", true, vllm))
	api.Put(podsPath, newPod("b", "10.0.0.2", false, vllm))
	api.Put(podsPath, newPod("other", "10.0.0.9", true, map[string]string{"app": "web"}))
	rec := newRecorder()
	run(t, func(ctx context.Context) {
		_ = c.FollowPods(ctx, kube.Pods{Namespace: "llm", Selector: "app=vllm", Ports: []int{8000}}, rec.set, nil)
	})
	rec.await(t, "listed", "10.0.0.1:8000")

	api.Put(podsPath, newPod("b", "10.0.0.2", true, vllm))
	rec.await(t, "b ready", "10.0.0.1:8000", "10.0.0.2:8000")
	api.Put(podsPath, newPod("a", "10.0.0.1", false, vllm))
	rec.await(t, "a unready", "10.0.0.2:8000")
	api.Put(podsPath, newPod("c", "", true, vllm)) // no IP yet
	api.Put(podsPath, newPod("a", "10.0.0.1", true, vllm))
	rec.await(t, "a ready again, c without IP", "10.0.0.1:8000", "10.0.0.2:8000")
	api.Delete(podsPath, "b")
	rec.await(t, "b deleted", "10.0.0.1:8000")
	api.Put(podsPath, newPod("e", "10.0.0.5", true, vllm))
	rec.await(t, "e added", "10.0.0.1:8000", "10.0.0.5:8000")
	api.Put(podsPath, newPod("e", "10.0.0.5", true, map[string]string{"app": "moved"}))
	rec.await(t, "e relabeled out of the selector", "10.0.0.1:8000")

	api.DropWatches()
	api.Put(podsPath, newPod("c", "10.0.0.3", true, vllm))
	rec.await(t, "after a dropped watch", "10.0.0.1:8000", "10.0.0.3:8000")

	// A 410: a change, then the watch's version compacted away.
	lists := api.Lists()
	api.Delete(podsPath, "a")
	api.Expire()
	rec.await(t, "after a 410", "10.0.0.3:8000")
	awaitLists(t, api, lists)
	api.Put(podsPath, newPod("d", "10.0.0.4", true, vllm))
	rec.await(t, "watching again after the relist", "10.0.0.3:8000", "10.0.0.4:8000")
}

// awaitLists waits for the server to serve more lists than n: a relist.
func awaitLists(t *testing.T, api *kubeapi.Server, n int) {
	t.Helper()
	wait.For(t, "a relist after a 410", func() bool { return api.Lists() > n })
}

// TestFollowPool follows an InferencePool and its pods: the pool's
// selector and target ports change, the pool goes and comes back.
func TestFollowPool(t *testing.T) {
	api, c := start(t)
	api.Put(podsPath, newPod("a1", "10.0.1.1", true, map[string]string{"pool": "a"}))
	api.Put(podsPath, newPod("b1", "10.0.2.1", true, map[string]string{"pool": "b"}))
	api.Put(poolsPath, newPool("other", map[string]string{"pool": "b"}, 9000))
	rec := newRecorder()
	run(t, func(ctx context.Context) { _ = c.FollowPool(ctx, "llm", "mine", rec.set, nil) })
	rec.await(t, "no pool yet")

	api.Put(poolsPath, newPool("mine", map[string]string{"pool": "a"}, 8000))
	rec.await(t, "pool created", "10.0.1.1:8000")
	api.Put(podsPath, newPod("a2", "10.0.1.2", true, map[string]string{"pool": "a"}))
	rec.await(t, "a pod joins", "10.0.1.1:8000", "10.0.1.2:8000")
	api.Put(poolsPath, newPool("mine", map[string]string{"pool": "b"}, 8000, 8001))
	rec.await(t, "selector and ports changed", "10.0.2.1:8000", "10.0.2.1:8001")
	api.Put(podsPath, newPod("a3", "10.0.1.3", true, map[string]string{"pool": "a"}))
	api.Put(podsPath, newPod("b1", "10.0.2.1", false, map[string]string{"pool": "b"}))
	rec.await(t, "old selector's pods ignored")
	api.Put(podsPath, newPod("b1", "10.0.2.1", true, map[string]string{"pool": "b"}))
	rec.await(t, "b1 ready", "10.0.2.1:8000", "10.0.2.1:8001")
	api.Delete(poolsPath, "mine")
	rec.await(t, "pool deleted")
	lists := api.Lists()
	api.Put(poolsPath, newPool("mine", map[string]string{"pool": "a"}, 8000))
	api.Expire()
	awaitLists(t, api, lists)
	rec.await(t, "pool back, after a 410", "10.0.1.1:8000", "10.0.1.2:8000", "10.0.1.3:8000")
}

// TestFollowObjectives follows the InferenceObjectives of a pool: their
// priorities by name (unset: 0), another pool's left out, a change and a
// deletion seen.
func TestFollowObjectives(t *testing.T) {
	api, c := start(t)
	path := "/apis/inference.networking.x-k8s.io/v1alpha2/namespaces/llm/inferenceobjectives"
	objective := func(name, pool string, prio *int) map[string]any {
		spec := map[string]any{"poolRef": map[string]any{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": pool}}
		if prio != nil {
			spec["priority"] = *prio
		}
		return map[string]any{"apiVersion": "inference.networking.x-k8s.io/v1alpha2", "kind": "InferenceObjective",
			"metadata": map[string]any{"name": name}, "spec": spec}
	}
	ten, minus := 10, -1
	api.Put(path, objective("critical", "vllm", &ten))
	api.Put(path, objective("default", "vllm", nil))
	api.Put(path, objective("elsewhere", "other", &ten))
	var mu sync.Mutex
	var got map[string]int
	run(t, func(ctx context.Context) {
		_ = c.FollowObjectives(ctx, "llm", "vllm", func(m map[string]int) { mu.Lock(); got = m; mu.Unlock() }, nil)
	})
	await := func(what string, want map[string]int) {
		t.Helper()
		wait.For(t, what, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return got != nil && maps.Equal(got, want)
		})
	}
	await("listed", map[string]int{"critical": 10, "default": 0})
	api.Put(path, objective("default", "vllm", &minus))
	await("default made sheddable", map[string]int{"critical": 10, "default": -1})
	api.Delete(path, "critical")
	await("critical deleted", map[string]int{"default": -1})
}

// TestBoundedBodies: a list larger than MaxBodyBytes is refused, not
// read, and retried; nothing is reported from it.
func TestBoundedBodies(t *testing.T) {
	api := kubeapi.New()
	ts := httptest.NewServer(api)
	t.Cleanup(ts.Close)
	c, err := kube.New(kube.Config{Server: ts.URL, MaxBodyBytes: 2048})
	if err != nil {
		t.Fatal(err)
	}
	big := newPod("big", "10.0.0.1", true, map[string]string{"app": "vllm"})
	big.Annotations = map[string]string{"note": strings.Repeat("x", 4096)}
	api.Put(podsPath, big)
	rec := newRecorder()
	run(t, func(ctx context.Context) {
		_ = c.FollowPods(ctx, kube.Pods{Namespace: "llm", Selector: "app=vllm", Ports: []int{8000}}, rec.set, nil)
	})
	awaitLists(t, api, 1) // a second list: the first was refused and retried
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.n != 0 {
		t.Errorf("reported %q from a list over the bound", rec.last)
	}
}

// TestInCluster: the in-cluster configuration needs the service host and
// port variables and the mounted token.
func TestInCluster(t *testing.T) {
	if _, err := kube.InCluster(func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "not in a cluster") {
		t.Errorf("without KUBERNETES_SERVICE_HOST: %v, want not in a cluster", err)
	}
	env := map[string]string{kube.EnvServiceHost: "10.96.0.1", kube.EnvServicePort: "443"}
	cfg, err := kube.InCluster(func(k string) string { return env[k] })
	if _, statErr := os.Stat(kube.ServiceAccountDir + "/token"); statErr != nil {
		if err == nil || !strings.Contains(err.Error(), "token") {
			t.Errorf("without a mounted token: %v, want an error naming it", err)
		}
		return
	}
	if err != nil || cfg.Server != "https://10.96.0.1:443" {
		t.Errorf("in a pod: %+v, %v", cfg, err)
	}
}

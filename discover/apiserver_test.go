package discover

import (
	"context"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/kvrouter/kvrouter/internal/kubeapi"
	"github.com/kvrouter/kvrouter/internal/kubeserver"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/kube"
)

// TestRealAPIServer runs discovery against a real kube-apiserver on a
// real etcd (internal/kubeserver; skipped without the binaries, failed
// under CI without them), with pods whose status the test sets through
// the status subresource as a kubelet would:
//   - docs/kubernetes.md's k8s://llm/app.kubernetes.io/name=vllm?port=8000
//     follows the ready pods of that prefixed label, and a set-based
//     selector the pods it selects;
//   - inferencepool://llm/vllm follows the pool of the pinned CRD, and
//     its selector's changes;
//   - the service account bound to deploy/rbac.yaml's Role (list and
//     watch only) may follow both, and the one bound to
//     deploy/epp/rbac.yaml's may follow the pool and win the Lease of a
//     leader election, renew it and release it.
func TestRealAPIServer(t *testing.T) {
	s := kubeserver.Start(t)
	s.CreateNamespace(t, "llm")
	admin, err := kube.New(kube.Config{Server: s.URL, TokenFile: s.AdminTokenFile, CAFile: s.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	pods := "/api/v1/namespaces/llm/pods"
	vllm := map[string]string{"app.kubernetes.io/name": "vllm"}
	s.CreatePod(t, "llm", "vllm-0", vllm)
	s.CreatePod(t, "llm", "vllm-1", map[string]string{"app.kubernetes.io/name": "vllm", "canary": "true"})
	s.CreatePod(t, "llm", "web-0", map[string]string{"app.kubernetes.io/name": "web"})
	s.SetPodStatus(t, "llm", "web-0", "10.1.0.9", true)

	t.Run("documented selector", func(t *testing.T) {
		rec := follow(t, admin, "k8s://llm/app.kubernetes.io/name=vllm?port=8000")
		rec.await(t, "no pod ready yet")
		s.SetPodStatus(t, "llm", "vllm-0", "10.1.0.1", true)
		rec.await(t, "vllm-0 ready", "http://10.1.0.1:8000")
		s.SetPodStatus(t, "llm", "vllm-1", "10.1.0.2", true)
		rec.await(t, "vllm-1 ready", "http://10.1.0.1:8000", "http://10.1.0.2:8000")
		set := follow(t, admin, "k8s://llm/app.kubernetes.io/name in (vllm,web),!canary?port=8000")
		set.await(t, "the set-based selector", "http://10.1.0.1:8000", "http://10.1.0.9:8000")
		s.SetPodStatus(t, "llm", "vllm-1", "10.1.0.2", false)
		rec.await(t, "vllm-1 not ready", "http://10.1.0.1:8000")
		s.Delete(t, pods+"/vllm-0")
		rec.await(t, "vllm-0 deleted")
		set.await(t, "vllm-0 deleted, set-based", "http://10.1.0.9:8000")
	})

	t.Run("inferencepool", func(t *testing.T) {
		s.InstallPoolCRD(t, "llm")
		s.CreatePod(t, "llm", "vllm-2", vllm)
		s.SetPodStatus(t, "llm", "vllm-2", "10.1.0.3", true)
		rec := follow(t, admin, "inferencepool://llm/vllm")
		rec.await(t, "no pool yet")
		pool := kubeapi.Pool("vllm", vllm, 8000)
		s.Create(t, "/apis/inference.networking.k8s.io/v1/namespaces/llm/inferencepools", pool)
		rec.await(t, "the pool's ready pod", "http://10.1.0.3:8000")
		s.Patch(t, "/apis/inference.networking.k8s.io/v1/namespaces/llm/inferencepools/vllm",
			map[string]any{"spec": map[string]any{"selector": map[string]any{"matchLabels": map[string]string{"app.kubernetes.io/name": "web"}}}})
		rec.await(t, "the pool's new selector", "http://10.1.0.9:8000")
	})

	t.Run("rbac", func(t *testing.T) {
		router, err := kube.New(kube.Config{Server: s.URL, TokenFile: s.RouterTokenFile, CAFile: s.CAFile})
		if err != nil {
			t.Fatal(err)
		}
		bind(t, s, "../deploy/rbac.yaml", "kvrouter")
		rec := follow(t, router, "k8s://llm/app.kubernetes.io/name=web?port=8000")
		rec.await(t, "the router's account, pods", "http://10.1.0.9:8000")
		pool := follow(t, router, "inferencepool://llm/vllm")
		pool.await(t, "the router's account, the pool", "http://10.1.0.9:8000")

		epp, err := kube.New(kube.Config{Server: s.URL, TokenFile: s.EPPTokenFile, CAFile: s.CAFile})
		if err != nil {
			t.Fatal(err)
		}
		bind(t, s, "../deploy/epp/rbac.yaml", "kvrouter-epp")
		follow(t, epp, "inferencepool://llm/vllm").await(t, "the picker's account, the pool", "http://10.1.0.9:8000")
		e := &kube.Election{Client: epp, Namespace: "llm", Name: "kvrouter-epp-vllm", Identity: "epp-0",
			LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 100 * time.Millisecond}
		ctx, stop := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- e.Run(ctx) }()
		wait.For(t, "the picker's account leading", e.Leader)
		var l struct {
			Spec struct {
				HolderIdentity string `json:"holderIdentity"`
				RenewTime      string `json:"renewTime"`
			} `json:"spec"`
		}
		get := func() {
			if err := s.Do(http.MethodGet, "/apis/coordination.k8s.io/v1/namespaces/llm/leases/kvrouter-epp-vllm", "", nil, &l); err != nil {
				t.Fatal(err)
			}
		}
		get()
		first := l.Spec.RenewTime
		wait.For(t, "the lease renewed", func() bool { get(); return l.Spec.RenewTime != first })
		stop()
		if err := <-ran; err != nil {
			t.Fatal(err)
		}
		if get(); l.Spec.HolderIdentity != "" {
			t.Errorf("lease held by %q after the leader stopped, want released", l.Spec.HolderIdentity)
		}
	})
}

// follow runs a Discoverer of target on c until the test ends and
// returns what it reports.
func follow(t *testing.T, c *kube.Client, target string) *listRecorder {
	t.Helper()
	tg, err := Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rec := &listRecorder{}
	d, err := New(Config{Target: tg, Kube: c, OnChange: rec.set})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { d.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return rec
}

// listRecorder keeps the last list a Discoverer reported.
type listRecorder struct {
	mu   sync.Mutex
	last []string
	seen bool
}

func (r *listRecorder) set(urls []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last, r.seen = urls, true
}

// await waits for the list to be want (none: empty).
func (r *listRecorder) await(t *testing.T, what string, want ...string) {
	t.Helper()
	wait.For(t, what, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.seen && slices.Equal(r.last, want) || r.seen && len(want) == 0 && len(r.last) == 0
	})
}

// bind creates the Role of the manifest file in namespace llm and binds
// it to service account sa, as kustomize's namespace gives the binding's
// subject its namespace.
func bind(t *testing.T, s *kubeserver.Server, file, sa string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var role map[string]any
	for doc := range strings.SplitSeq(string(b), "\n---\n") {
		var o map[string]any
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatal(err)
		}
		if o["kind"] == "Role" {
			role = o
		}
	}
	if role == nil {
		t.Fatalf("no Role in %s", file)
	}
	name := role["metadata"].(map[string]any)["name"]
	s.Create(t, "/apis/rbac.authorization.k8s.io/v1/namespaces/llm/roles", role)
	s.Create(t, "/apis/rbac.authorization.k8s.io/v1/namespaces/llm/rolebindings", map[string]any{
		"metadata": map[string]any{"name": name},
		"subjects": []any{map[string]any{"kind": "ServiceAccount", "name": sa, "namespace": "llm"}},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
	})
}

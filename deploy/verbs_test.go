package deploy

import (
	"context"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/kvrouter/kvrouter/internal/kubeapi"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/kube"
)

// verbLog records the requests a loopback API server got as
// kube-apiserver's authorizer sees them: group/resource → verbs.
type verbLog struct {
	mu   sync.Mutex
	used map[string]map[string]bool
}

// requestVerb names a request as the API server's RequestInfo does: the
// resource's "group/resource" and the verb (get, list, watch, create,
// update, patch, delete).
func requestVerb(r *http.Request) (resource, verb string) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	group, rest := "", parts
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		rest = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		group, rest = parts[1], parts[3:]
	}
	if len(rest) >= 2 && rest[0] == "namespaces" {
		rest = rest[2:]
	}
	if len(rest) == 0 {
		return "", ""
	}
	named := len(rest) > 1
	switch {
	case r.Method == http.MethodGet && r.URL.Query().Get("watch") == "true":
		verb = "watch"
	case r.Method == http.MethodGet && named:
		verb = "get"
	case r.Method == http.MethodGet:
		verb = "list"
	case r.Method == http.MethodPost:
		verb = "create"
	case r.Method == http.MethodPut:
		verb = "update"
	default:
		verb = strings.ToLower(r.Method)
	}
	return group + "/" + rest[0], verb
}

func (l *verbLog) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, verb := requestVerb(r)
		l.mu.Lock()
		if l.used[res] == nil {
			l.used[res] = map[string]bool{}
		}
		l.used[res][verb] = true
		l.mu.Unlock()
		h.ServeHTTP(w, r)
	})
}

// granted is what role grants: group/resource → verbs.
func granted(role *rbacv1.Role) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for _, r := range role.Rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				if out[g+"/"+res] == nil {
					out[g+"/"+res] = map[string]bool{}
				}
				for _, v := range r.Verbs {
					out[g+"/"+res][v] = true
				}
			}
		}
	}
	return out
}

// TestRolesGrantTheVerbsUsed runs package kube's calls on a loopback API
// server that records each request's verb as kube-apiserver's
// authorizer names it: serve's discovery (k8s:// and inferencepool://
// targets), and the endpoint picker's (its pool, its objectives, leader
// election through acquire, renew and release). deploy/rbac.yaml's Role
// must grant exactly what serve used, deploy/epp/rbac.yaml's exactly what
// the picker used: no verb missing, and none that the code never calls.
func TestRolesGrantTheVerbsUsed(t *testing.T) {
	roles := map[string]*rbacv1.Role{}
	for _, o := range manifests(t) {
		if r, ok := o.v.(*rbacv1.Role); ok {
			roles[r.Name] = r
		}
	}
	serve := usedVerbs(t, func(ctx context.Context, c *kube.Client, seen func()) {
		var wg sync.WaitGroup
		wg.Go(func() {
			_ = c.FollowPods(ctx, kube.Pods{Namespace: "llm", Selector: "app.kubernetes.io/name=vllm", Ports: []int{8000}}, func([]string) { seen() }, nil)
		})
		wg.Go(func() { _ = c.FollowPool(ctx, "llm", "vllm", func([]string) { seen() }, nil) })
		wg.Wait()
	})
	epp := usedVerbs(t, func(ctx context.Context, c *kube.Client, seen func()) {
		e := &kube.Election{Client: c, Namespace: "llm", Name: "kvrouter-epp-vllm", Identity: "epp-0",
			LeaseDuration: 900 * time.Millisecond, RenewDeadline: 600 * time.Millisecond, RetryPeriod: 20 * time.Millisecond}
		ectx, stop := context.WithCancel(ctx)
		ran := make(chan struct{})
		go func() { defer close(ran); _ = e.Run(ectx) }()
		wait.For(t, "the lease taken", e.Leader)
		time.Sleep(100 * time.Millisecond) // a few renewals (RetryPeriod 20 ms): the update verb under test
		stop()                             // releases the lease
		<-ran
		var wg sync.WaitGroup
		wg.Go(func() { _ = c.FollowPool(ctx, "llm", "vllm", func([]string) { seen() }, nil) })
		wg.Go(func() { _ = c.FollowObjectives(ctx, "llm", "vllm", func(map[string]int) { seen() }, nil) })
		wg.Wait()
	})
	for name, used := range map[string]map[string]map[string]bool{"kvrouter-discovery": serve, "kvrouter-epp": epp} {
		role := roles[name]
		if role == nil {
			t.Errorf("no Role %s in deploy/", name)
			continue
		}
		got := granted(role)
		for _, res := range slices.Sorted(maps.Keys(got)) {
			if g, u := slices.Sorted(maps.Keys(got[res])), slices.Sorted(maps.Keys(used[res])); !slices.Equal(g, u) {
				t.Errorf("Role %s grants %v on %s; the code calls %v", name, g, res, u)
			}
		}
		for res, verbs := range used {
			if got[res] == nil {
				t.Errorf("Role %s grants nothing on %s; the code calls %v", name, res, slices.Sorted(maps.Keys(verbs)))
			}
		}
	}
}

// usedVerbs runs calls against a loopback API server holding a pool, its
// pod and an objective until ctx is cancelled (calls returns when it is
// done), and returns the verbs they used by resource.
func usedVerbs(t *testing.T, calls func(ctx context.Context, c *kube.Client, seen func())) map[string]map[string]bool {
	t.Helper()
	api := kubeapi.New()
	vllm := map[string]string{"app.kubernetes.io/name": "vllm"}
	api.Put(kubeapi.PodsPath("llm"), kubeapi.Pod("vllm-0", "10.0.0.1", true, vllm))
	api.Put(kubeapi.PoolsPath("llm"), kubeapi.Pool("vllm", vllm, 8000))
	log := &verbLog{used: map[string]map[string]bool{}}
	ts := httptest.NewServer(log.wrap(api))
	defer ts.Close()
	c, err := kube.New(kube.Config{Server: ts.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	reports := 0
	seen := func() {
		mu.Lock()
		defer mu.Unlock()
		reports++
	}
	done := make(chan struct{})
	go func() { defer close(done); calls(ctx, c, seen) }()
	wait.For(t, "the watches' first reports and their watch requests", func() bool {
		mu.Lock()
		defer mu.Unlock()
		log.mu.Lock()
		defer log.mu.Unlock()
		watching := 0
		for _, v := range log.used {
			if v["watch"] {
				watching++
			}
		}
		return reports >= 2 && watching >= 2
	})
	cancel()
	<-done
	log.mu.Lock()
	defer log.mu.Unlock()
	return log.used
}

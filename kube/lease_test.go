package kube_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/kubeapi"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/kube"
)

var leasesPath = kubeapi.LeasesPath("llm")

func newElection(c *kube.Client, id string) *kube.Election {
	return &kube.Election{Client: c, Namespace: "llm", Name: "kvrouter-epp", Identity: id,
		LeaseDuration: 900 * time.Millisecond, RenewDeadline: 600 * time.Millisecond, RetryPeriod: 100 * time.Millisecond}
}

// TestElection runs two candidates on one Lease: exactly one leads at a
// time, and when the leader stops (releasing the lease) the other takes
// over within a retry period or two, and the Lease names it.
func TestElection(t *testing.T) {
	api, c := start(t)
	a, b := newElection(c, "epp-a"), newElection(c, "epp-b")
	ctxA, stopA := context.WithCancel(context.Background())
	ctxB, stopB := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = a.Run(ctxA) })
	wg.Go(func() { _ = b.Run(ctxB) })
	defer func() { stopA(); stopB(); wg.Wait() }()

	wait.For(t, "a leader", func() bool { return a.Leader() || b.Leader() })
	for range 100 { // 1 s: several renewals
		if a.Leader() && b.Leader() {
			t.Fatal("both candidates lead")
		}
		time.Sleep(10 * time.Millisecond) // one leader through the renewals: the behaviour under test
	}
	leader, follower, stop := a, b, stopA
	if b.Leader() {
		leader, follower, stop = b, a, stopB
	}
	if follower.Leader() {
		t.Fatal("the follower leads too")
	}
	stop()
	// A leader that stops releases the lease: the follower takes it at its
	// next try, well within the lease's duration (1 s).
	wait.Within(t, time.Second, follower.Identity+" taking over from "+leader.Identity, follower.Leader)
	l := api.Get(leasesPath, "kvrouter-epp")
	spec, _ := l["spec"].(map[string]any)
	if spec["holderIdentity"] != follower.Identity {
		t.Errorf("lease holder %v, want %s", spec["holderIdentity"], follower.Identity)
	}
	if n, _ := spec["leaseTransitions"].(float64); n < 1 {
		t.Errorf("leaseTransitions %v, want ≥ 1", spec["leaseTransitions"])
	}
}

// TestElectionExpiry: a holder that stops renewing without releasing
// (a crashed pod) loses the lease once the record has not changed for its
// duration; a holder whose record changes keeps it, whatever its clock
// says (renewTime far in the past).
func TestElectionExpiry(t *testing.T) {
	api, c := start(t)
	stale := time.Now().Add(-2 * time.Second).UTC().Format("2006-01-02T15:04:05.000000Z07:00")
	api.Put(leasesPath, map[string]any{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
		"metadata": map[string]any{"name": "kvrouter-epp"},
		"spec":     map[string]any{"holderIdentity": "crashed", "leaseDurationSeconds": 1, "renewTime": stale}})
	e := newElection(c, "epp-a")
	run(t, func(ctx context.Context) { _ = e.Run(ctx) })
	start := time.Now()
	wait.For(t, "the expired lease taken", e.Leader)
	if took := time.Since(start); took < time.Second {
		t.Errorf("took the lease after %s, before its 1 s duration without a change", took)
	}
	// A holder renewing every 200 ms with a skewed clock (a renewTime an
	// hour old, changing) keeps its lease of 1 s.
	o := newElection(c, "epp-b")
	o.Name = "other"
	run(t, func(ctx context.Context) {
		for i := 0; ctx.Err() == nil; i++ {
			skewed := time.Now().Add(-time.Hour + time.Duration(i)*time.Millisecond).UTC().Format("2006-01-02T15:04:05.000000Z07:00")
			api.Put(leasesPath, map[string]any{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
				"metadata": map[string]any{"name": "other"},
				"spec":     map[string]any{"holderIdentity": "alive", "leaseDurationSeconds": 1, "renewTime": skewed}})
			time.Sleep(200 * time.Millisecond) // the holder's renewal period
		}
	})
	run(t, func(ctx context.Context) { _ = o.Run(ctx) })
	for range 30 { // 1.5 s: past the lease's duration
		if o.Leader() {
			t.Fatal("took a lease its holder renews")
		}
		time.Sleep(50 * time.Millisecond) // not taking the lease for 1.5 s is the behaviour under test
	}
}

// TestLeaseConflict: an update carrying a stale resourceVersion is 409
// Conflict, a create of an existing lease 409 AlreadyExists.
func TestLeaseConflict(t *testing.T) {
	api := kubeapi.New()
	ts := httptest.NewServer(api)
	defer ts.Close()
	rv := api.Put(leasesPath, map[string]any{"metadata": map[string]any{"name": "l"}})
	api.Put(leasesPath, map[string]any{"metadata": map[string]any{"name": "l"}})
	for _, tc := range []struct {
		method, path, body string
		want               int
	}{
		{http.MethodPut, leasesPath + "/l", `{"metadata":{"name":"l","resourceVersion":"` + rv + `"}}`, http.StatusConflict},
		{http.MethodPost, leasesPath, `{"metadata":{"name":"l"}}`, http.StatusConflict},
		{http.MethodGet, leasesPath + "/none", ``, http.StatusNotFound},
		{http.MethodPut, leasesPath + "/l", `{"metadata":{"name":"l"}}`, http.StatusOK},
	} {
		req, _ := http.NewRequest(tc.method, ts.URL+tc.path, strings.NewReader(tc.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s: got %d, want %d", tc.method, tc.path, resp.StatusCode, tc.want)
		}
	}
}

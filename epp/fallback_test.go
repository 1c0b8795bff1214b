package epp

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/proxy"
	"github.com/kvrouter/kvrouter/view"
)

// TestDestinationList: the protocol cases of GIE's endpoint-picker
// protocol for the destination (docs/proposals/004-endpoint-picker-
// protocol): the header and the envoy.lb metadata carry the same value,
// "ip:port,ip:port,...", the picked endpoint first, then distinct
// fallbacks among the pool's healthy endpoints, within the subset hint
// when Envoy sends one, as many as Config.Fallbacks.
func TestDestinationList(t *testing.T) {
	tests := []struct {
		name      string
		fallbacks int
		subset    []int // replicas in the subset hint; nil: none
		want      int   // endpoints in the list
	}{
		{"default: none", 0, nil, 1},
		{"two fallbacks", 2, nil, 3},
		{"one fallback", 1, nil, 2},
		{"more asked than replicas", 8, nil, 4},
		{"within the subset", 3, []int{1, 3}, 2},
		{"a subset of one", 3, []int{2}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := start(t, 4, Config{Fallbacks: tt.fallbacks}, nil)
			hosts := map[string]bool{}
			for _, r := range f.reps {
				hosts[hostOf(t, r.URL())] = true
			}
			wait.For(t, "replicas healthy", func() bool { return healthy(f) == len(f.reps) })
			r := chat("m", "s", words(1, 40), false)
			var allowed map[string]bool
			if tt.subset != nil {
				allowed = map[string]bool{}
				for _, i := range tt.subset {
					h := hostOf(t, f.reps[i].URL())
					r.subset, allowed[h] = append(r.subset, h), true
				}
			}
			ex := f.do(t, r)
			if ex.immediate != nil {
				t.Fatalf("answered %v, want routed", ex.immediate)
			}
			list := strings.Split(ex.list, ",")
			if ex.metadata != ex.list {
				t.Errorf("metadata %q, header %q: must be the same value", ex.metadata, ex.list)
			}
			if len(list) != tt.want {
				t.Errorf("list %q: %d endpoints, want %d", ex.list, len(list), tt.want)
			}
			seen := map[string]bool{}
			for _, ep := range list {
				if !hosts[ep] || seen[ep] || allowed != nil && !allowed[ep] {
					t.Errorf("list %q: endpoint %q unknown, repeated or outside the subset", ex.list, ep)
				}
				seen[ep] = true
			}
			if ex.served != list[0] || ex.status != 200 {
				t.Errorf("served by %q with %d, want the primary %q and 200", ex.served, ex.status, list[0])
			}
			d := f.rt.Decisions(1)
			if len(d) != 1 || hostOf(t, d[0].Replica) != list[0] || d[0].Served != list[0] || len(d[0].Failed) != 0 {
				t.Fatalf("decision record %+v: want replica and served %s, nothing failed", d, list[0])
			}
			// The fallbacks are the policy's other candidates, cheapest
			// first (the record's candidates, priced in full).
			cands := slices.Clone(d[0].Candidates)
			slices.SortStableFunc(cands, func(a, b view.Candidate) int { return cmp.Compare(a.TotalMS, b.TotalMS) })
			var want []string
			for _, c := range cands {
				if h := hostOf(t, c.Replica); h != list[0] && (allowed == nil || allowed[h]) {
					want = append(want, h)
				}
			}
			for _, rep := range f.reps { // then the others, in the backends' order
				if h := hostOf(t, rep.URL()); h != list[0] && !slices.Contains(want, h) && (allowed == nil || allowed[h]) {
					want = append(want, h)
				}
			}
			if len(want) < len(list)-1 || !slices.Equal(list[1:], want[:len(list)-1]) {
				t.Errorf("fallbacks %q, want the candidates cheapest first, then the rest: %q (%d candidates)", list[1:], want, len(cands))
			}
		})
	}
}

// healthy counts the replicas the router holds healthy.
func healthy(f *fixture) int {
	n := 0
	for _, r := range f.rt.View(time.Now()).Replicas {
		if r.Healthy {
			n++
		}
	}
	return n
}

// TestFallbackServes: the picked engine goes away between the pick and
// the forward; the test's Envoy goes down the list to the first fallback,
// which serves, and reports it: the decision record says served by the
// fallback, the picked replica failed, and the served counter says
// fallback.
func TestFallbackServes(t *testing.T) {
	f := start(t, 3, Config{Fallbacks: 2}, nil)
	wait.For(t, "replicas healthy", func() bool { return healthy(f) == len(f.reps) })
	r := chat("m", "s", words(2, 40), true)
	r.hold = func(primary string) {
		for _, rep := range f.reps {
			if hostOf(t, rep.URL()) == primary {
				rep.Close() // refused from now: Envoy's connect fails
			}
		}
	}
	ex := f.do(t, r)
	list := strings.Split(ex.list, ",")
	if len(list) < 2 {
		t.Fatalf("list %q: want a fallback", ex.list)
	}
	if ex.served != list[1] || ex.status != 200 || !strings.Contains(string(ex.respBody), "[DONE]") {
		t.Fatalf("served by %q (status %d), want the first fallback %q and a whole stream", ex.served, ex.status, list[1])
	}
	d := f.rt.Decisions(1)
	if len(d) != 1 || d[0].Served != list[1] || !slices.ContainsFunc(d[0].Failed, func(u string) bool { return hostOf(t, u) == list[0] }) {
		t.Errorf("decision record %+v: want served %s and %s among failed", d, list[1], list[0])
	}
	for _, c := range []struct {
		label string
		want  float64
	}{{"fallback", 1}, {"primary", 0}, {"unreported", 0}} {
		if got := f.metric(t, "kvrouter_epp_served_total", "endpoint", c.label); got != c.want {
			t.Errorf("kvrouter_epp_served_total{endpoint=%s} = %v, want %v", c.label, got, c.want)
		}
	}
}

// TestReadinessFollowsLeadership: with Elected, the picker is not ready
// until it leads and not ready again once it stops, while liveness stays
// serving, as GIE documents.
func TestReadinessFollowsLeadership(t *testing.T) {
	f := start(t, 1, Config{Elected: true}, nil)
	hc := healthpb.NewHealthClient(f.conn)
	status := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetStatus()
	}
	wait.For(t, "a healthy replica", f.srv.anyHealthy)
	for i, leader := range []bool{false, true, false} {
		f.srv.SetLeader(leader)
		want := healthpb.HealthCheckResponse_NOT_SERVING
		if leader {
			want = healthpb.HealthCheckResponse_SERVING
		}
		for _, svc := range []string{HealthReadiness, extprocv3.ExternalProcessor_ServiceDesc.ServiceName, "", HealthInferenceExtension} {
			if got := status(svc); got != want {
				t.Errorf("step %d (leader %v): %s %v, want %v", i, leader, svc, got, want)
			}
		}
		if got := status(HealthLiveness); got != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("step %d: liveness %v, want SERVING", i, got)
		}
	}
}

// TestObjectivePriority: a request naming an InferenceObjective of the
// pool gets its priority, clamped, in place of the client's; an unknown
// objective or none leaves the request as it came.
func TestObjectivePriority(t *testing.T) {
	prio := map[string]int{"critical": 10, "batch": -1, "huge": 5000, "unset": 0}
	tests := []struct {
		objective, client, want string
	}{
		{"critical", "", "10"},
		{"batch", "", "-1"},
		{"batch", "100", "-1"},
		{"huge", "", "1000"},
		{"unset", "7", "0"},
		{"unknown", "7", "7"},
		{"unknown", "", ""},
		{"", "3", "3"},
	}
	for _, tt := range tests {
		h := http.Header{}
		if tt.objective != "" {
			h.Set(ObjectiveHeader, tt.objective)
		}
		if tt.client != "" {
			h.Set(proxy.HeaderPriority, tt.client)
		}
		objectivePriority(h, prio)
		if got := h.Get(proxy.HeaderPriority); got != tt.want {
			t.Errorf("objective %q, client priority %q: got %q, want %q", tt.objective, tt.client, got, tt.want)
		}
	}
}

// TestObjectiveSheds: through the picker, a request whose objective is
// sheddable (negative priority) is refused at once when the fleet is
// saturated, as GIE's flow control drops sheddable requests (without
// the objective it would wait in the admission queue, behind the held
// request, until the queue's timeout).
func TestObjectiveSheds(t *testing.T) {
	f := start(t, 1, Config{}, func(c *proxy.Config) {
		c.Admission.MaxWait, c.Admission.MaxQueue, c.Admission.QueueTimeout = time.Millisecond, 4, 20*time.Second
	})
	f.srv.SetObjectives(map[string]int{"batch": -1})
	wait.For(t, "replica healthy", f.srv.anyHealthy)
	// A long prompt in flight on the replica: every later one finds a
	// backlog past 1 ms.
	long := chat("m", "a", words(1, 6000), false)
	long.hold = func(string) {
		r := chat("m", "b", words(2, 6000), false)
		r.headers = append(r.headers, ObjectiveHeader, "batch")
		ex := f.do(t, r)
		if ex.immediate == nil || ex.immediate.GetStatus().GetCode() != 429 || !strings.Contains(string(ex.immediate.GetBody()), "queue_sheddable") {
			t.Errorf("sheddable objective while saturated: got %v, want an immediate 429 queue_sheddable", ex.immediate)
		}
	}
	if ex := f.do(t, long); ex.status != 200 {
		t.Errorf("the long request: status %d", ex.status)
	}
}

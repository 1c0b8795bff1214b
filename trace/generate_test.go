package trace

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// generated lists the synthetic workloads (no trace file needed).
var generated = []string{"shared-prefix", "multi-tenant-context", "multi-turn-chat", "agentic", "unique", "hot-prefix", "failure"}

func TestGenerateDeterministic(t *testing.T) {
	for _, name := range generated {
		t.Run(name, func(t *testing.T) {
			a, err := Generate(name, GenOptions{Seed: 7})
			if err != nil {
				t.Fatal(err)
			}
			b, _ := Generate(name, GenOptions{Seed: 7})
			if !reflect.DeepEqual(a, b) { // cmp.Diff is slow on thousands of requests
				t.Fatalf("same seed, different workloads:\n%s", cmp.Diff(a.Requests[:5], b.Requests[:5]))
			}
			c, _ := Generate(name, GenOptions{Seed: 8})
			if reflect.DeepEqual(a.Requests, c.Requests) {
				t.Errorf("seeds 7 and 8 gave identical workloads")
			}
		})
	}
}

func TestGenerateInvariants(t *testing.T) {
	for _, name := range generated {
		t.Run(name, func(t *testing.T) {
			w, err := Generate(name, GenOptions{Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			if len(w.Requests) == 0 {
				t.Fatal("no requests")
			}
			ids := map[string]bool{}
			for i, r := range w.Requests {
				if i > 0 && r.At < w.Requests[i-1].At {
					t.Fatalf("%s arrives at %v, before its predecessor (%v)", r.ID, r.At, w.Requests[i-1].At)
				}
				if got := promptOf(r.Segments); got != r.Prompt || r.Prompt < 1 {
					t.Fatalf("%s: segments sum to %d, Prompt %d", r.ID, got, r.Prompt)
				}
				if r.Output < 1 {
					t.Fatalf("%s: Output %d < 1", r.ID, r.Output)
				}
				if ids[r.ID] {
					t.Fatalf("duplicate id %s", r.ID)
				}
				ids[r.ID] = true
			}
		})
	}
}

// sharing counts the requests whose first segment is shared with another
// request, and the distinct first segments.
func sharing(reqs []Request) (shared, distinct int) {
	n := map[uint64]int{}
	for _, r := range reqs {
		n[r.Segments[0].ID]++
	}
	for _, r := range reqs {
		if n[r.Segments[0].ID] > 1 {
			shared++
		}
	}
	return shared, len(n)
}

func TestGenerateShapes(t *testing.T) {
	tests := []struct {
		name                   string
		opt                    GenOptions
		wantN                  int
		wantShared, wantGroups int // -1: don't check
	}{
		{"shared-prefix", GenOptions{}, 1024, 1024, 64},
		{"shared-prefix", GenOptions{Groups: 4, PerGroup: 3}, 12, 12, 4},
		{"shared-prefix", GenOptions{Requests: 100}, 112, 112, 7},
		{"unique", GenOptions{Requests: 50}, 50, 0, 50},
		{"multi-tenant-context", GenOptions{}, 2250, 2250, 150},
		{"multi-tenant-context", GenOptions{Requests: 500}, 500, -1, -1},
		{"multi-tenant-context", GenOptions{Groups: 4, PerGroup: 2}, 24, 24, 4},
		{"hot-prefix", GenOptions{Requests: 400, Groups: 4}, 400, 400, 5},
		{"agentic", GenOptions{Requests: 300}, 300, 300, 1},
		{"multi-turn-chat", GenOptions{Requests: 300}, 300, 300, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := Generate(tt.name, tt.opt)
			if err != nil {
				t.Fatal(err)
			}
			if got := len(w.Requests); got != tt.wantN {
				t.Errorf("got %d requests, want %d", got, tt.wantN)
			}
			shared, groups := sharing(w.Requests)
			if tt.wantShared >= 0 && shared != tt.wantShared {
				t.Errorf("got %d requests sharing their first segment, want %d", shared, tt.wantShared)
			}
			if tt.wantGroups >= 0 && groups != tt.wantGroups {
				t.Errorf("got %d distinct first segments, want %d", groups, tt.wantGroups)
			}
		})
	}
}

func TestTenantGroupsFor(t *testing.T) {
	const h100 = 450896 // llama3-8b-h100's KV tokens per replica
	tests := []struct {
		name     string
		kvTokens int
		users    int
		want     int
	}{
		{"zero: llm-d's fixed count", 0, 5, 150},
		{"llm-d's fleet: 8 × 307,328", 8 * 307328, 5, 150},
		{"16 × llama3-8b-h100", 16 * h100, 5, 439},
		{"4 × llama3-8b-h100", 4 * h100, 5, 110},
		{"fewer users, smaller groups", 4 * h100, 2, 157},
		{"a fleet smaller than one group", 1000, 5, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tenantGroupsFor(tt.kvTokens, tt.users); got != tt.want {
				t.Errorf("got %d groups, want %d", got, tt.want)
			}
		})
	}
}

// TestMultiTenantShape checks llm-d's benchmark shape on a fleet of 4
// llama3-8b-h100 replicas: 110 groups of 5 users, each user sending its
// group's 6,000-token context and its own 1,200-token question, the same
// prompt every time, in one shuffled order repeated 3 times.
func TestMultiTenantShape(t *testing.T) {
	w, err := Generate("multi-tenant-context", GenOptions{Seed: 4, FleetKVTokens: 4 * 450896})
	if err != nil {
		t.Fatal(err)
	}
	const groups, users, sets = 110, 5, 3
	if got, want := len(w.Requests), sets*groups*users; got != want {
		t.Fatalf("got %d requests, want %d", got, want)
	}
	prompt := map[string][]Segment{}    // user → its prompt
	groupUsers := map[uint64][]string{} // context id → its users
	questionOf := map[uint64]string{}   // question id → its user
	for i, r := range w.Requests {
		if len(r.Segments) != 2 || r.Segments[0].Tokens != 6000 || r.Segments[1].Tokens != 1200 || r.Output != 1000 {
			t.Fatalf("%s: segments %v, output %d; want a 6,000-token context, a 1,200-token question, 1,000 output tokens", r.ID, r.Segments, r.Output)
		}
		if !strings.HasPrefix(r.Session, r.Tenant+"-u") {
			t.Fatalf("%s: session %q is not a user of tenant %q", r.ID, r.Session, r.Tenant)
		}
		if p, ok := prompt[r.Session]; ok {
			if !slices.Equal(p, r.Segments) {
				t.Fatalf("%s: user %s sent %v, earlier %v; want the same prompt every time", r.ID, r.Session, r.Segments, p)
			}
		} else {
			prompt[r.Session] = r.Segments
			ctx, q := r.Segments[0].ID, r.Segments[1].ID
			groupUsers[ctx] = append(groupUsers[ctx], r.Session)
			if u, ok := questionOf[q]; ok {
				t.Fatalf("%s: users %s and %s share a question", r.ID, u, r.Session)
			}
			questionOf[q] = r.Session
		}
		if j := i - groups*users; j >= 0 && w.Requests[j].Session != r.Session {
			t.Fatalf("request %d is user %s, one full set earlier user %s; want the same order every set", i, r.Session, w.Requests[j].Session)
		}
	}
	if len(groupUsers) != groups {
		t.Errorf("got %d distinct contexts, want %d", len(groupUsers), groups)
	}
	for ctx, us := range groupUsers {
		if len(us) != users {
			t.Errorf("context %d is shared by %d users %v, want %d", ctx, len(us), us, users)
		}
	}
	if len(prompt) != groups*users {
		t.Errorf("got %d users in the first set, want %d", len(prompt), groups*users)
	}
	g, _ := Generate("multi-tenant-context", GenOptions{Groups: 7, FleetKVTokens: 4 * 450896})
	if _, n := sharing(g.Requests); n != 7 {
		t.Errorf("Groups 7 with FleetKVTokens: got %d groups, want Groups to win", n)
	}
}

func TestHotPrefixHalf(t *testing.T) {
	w, _ := Generate("hot-prefix", GenOptions{Seed: 3})
	hot := 0
	for _, r := range w.Requests {
		if r.Tenant == "hot" {
			hot++
		}
	}
	if f := float64(hot) / float64(len(w.Requests)); f < 0.45 || f > 0.55 {
		t.Errorf("hot prefix takes %.2f of traffic, want about 0.5", f)
	}
}

func TestMultiTurnGrows(t *testing.T) {
	w, _ := Generate("multi-turn-chat", GenOptions{Seed: 2, Requests: 500})
	bySession := map[string][]Request{}
	for _, r := range w.Requests {
		bySession[r.Session] = append(bySession[r.Session], r)
	}
	for s, turns := range bySession {
		if s == "" {
			t.Fatal("a chat turn has no session")
		}
		for i := 1; i < len(turns); i++ {
			prev, cur := turns[i-1], turns[i]
			// The previous prompt and its answer lead the next prompt.
			if !slices.Equal(prev.Segments, cur.Segments[:len(prev.Segments)]) || cur.Segments[len(prev.Segments)].Tokens != prev.Output {
				t.Fatalf("%s turn %d does not extend turn %d with its answer", s, i, i-1)
			}
			if cur.At-prev.At < time.Duration(prev.Output)*25*time.Millisecond {
				t.Fatalf("%s turn %d arrives before turn %d's answer is generated", s, i, i-1)
			}
		}
	}
}

func TestFailureEvents(t *testing.T) {
	w, err := Generate("failure", GenOptions{Base: "shared-prefix"})
	if err != nil {
		t.Fatal(err)
	}
	s := Summary(w.Requests)
	if len(w.Events) != 3 || w.Events[0].Kind != Kill || w.Events[1].Kind != Add || w.Events[1].Replica != -1 ||
		w.Events[2].Kind != Remove || w.Events[2].Replica != 1 || w.Events[2].At <= w.Events[1].At {
		t.Fatalf("got events %+v, want a kill, an add, then the removal of replica 1", w.Events)
	}
	if e := w.Events[0]; e.At <= w.Requests[0].At || e.At >= w.Requests[0].At+s.Duration {
		t.Errorf("kill at %v, outside the run [0, %v]", e.At, s.Duration)
	}
	at := w.Events[1].At
	w.Scale(2)
	if w.Events[1].At != 2*at {
		t.Errorf("Scale(2) moved the add to %v, want %v", w.Events[1].At, 2*at)
	}
	if _, err := Generate("failure", GenOptions{Base: "failure"}); err == nil {
		t.Error("failure of failure: got no error")
	}
	if _, err := Generate("nope", GenOptions{}); err == nil || !strings.Contains(err.Error(), "unknown workload") {
		t.Errorf("got %v, want an unknown workload error", err)
	}
}

func TestScaleAndSummary(t *testing.T) {
	reqs := []Request{
		{At: 0, Prompt: 100, Output: 10},
		{At: time.Second, Prompt: 300, Output: 30},
		{At: 2 * time.Second, Prompt: 200, Output: 20},
	}
	s := Summary(reqs)
	want := Stats{Requests: 3, PromptTokens: 600, OutputTokens: 60, Duration: 2 * time.Second,
		RequestRate: 1.5, PromptRate: 300, OutputRate: 30, MaxPrompt: 300}
	if diff := cmp.Diff(want, s); diff != "" {
		t.Errorf("Summary (-want +got):\n%s", diff)
	}
	f := s.ScaleFor(150) // half the offered load: twice the time
	if f != 2 {
		t.Fatalf("ScaleFor(150): got %v, want 2", f)
	}
	Scale(reqs, f)
	if got := Summary(reqs).PromptRate; got != 150 {
		t.Errorf("after Scale: got %v prompt tokens/s, want 150", got)
	}
	Scale(reqs, 0) // ignored
	if reqs[2].At != 4*time.Second {
		t.Errorf("Scale(0) changed arrivals: last at %v, want 4s", reqs[2].At)
	}
	if (Stats{}).ScaleFor(100) != 1 {
		t.Error("ScaleFor on an empty workload: want 1")
	}
}

package sim

import (
	"bytes"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/trace"
)

// sharedPrefix builds groups × prompts requests: each prompt is its group's
// prefix segment (prefix tokens) then a unique question (question tokens),
// arriving every gap, groups interleaved (g0 p0, g1 p0, ..., g0 p1, ...).
func sharedPrefix(groups, prompts, prefixTokens, question, output int, gap time.Duration) []trace.Request {
	var reqs []trace.Request
	for p := 0; p < prompts; p++ {
		for g := 0; g < groups; g++ {
			n := len(reqs)
			reqs = append(reqs, trace.Request{
				ID: fmt.Sprintf("g%d-p%d", g, p), At: time.Duration(n) * gap, Tenant: fmt.Sprint(g),
				Segments: []trace.Segment{{ID: uint64(1000 + g), Tokens: prefixTokens}, {ID: uint64(1_000_000 + n), Tokens: question}},
				Prompt:   prefixTokens + question, Output: output,
			})
		}
	}
	return reqs
}

func hitRate(res *result) float64 {
	var p, c int64
	for _, s := range res.samples {
		if s.OK {
			p += int64(s.Prompt)
			c += int64(s.Cached)
		}
	}
	if p == 0 {
		return 0
	}
	return float64(c) / float64(p)
}

// TestSharedPrefixByHand checks each policy's hit rate on a case small
// enough to count by hand: G groups × P prompts of a 2,048-token prefix
// (128 blocks of 16) and a 128-token unique question, on R replicas, with
// arrivals 10 s apart (each request finishes long before the next: no
// queues, no load differences) and far less data than one replica's cache
// (no eviction). A request hits its group's prefix (2,048 tokens) exactly
// when the replica it lands on served the group before, so
//
//	hit rate = 2048 × (G×P − misses) / (2176 × G×P)
//
// where misses counts (group, replica) first visits. Round-robin sends the
// k-th request (k = p×G + g) to replica k mod R: group g visits the
// replicas {(p×G + g) mod R : p < P}, computed below. A prefix-aware
// policy keeps a group on one replica: one miss per group. (preble-e2 is
// left out: its 3-minute load window sees the replicas' unequal prefill
// history and, by design, replicates a prefix to the lightest replica
// when the holder carries 1.5× its load.)
func TestSharedPrefixByHand(t *testing.T) {
	const G, P, R, prefix, question = 4, 6, 3, 2048, 128
	reqs := sharedPrefix(G, P, prefix, question, 16, 10*time.Second)
	rate := func(misses int) float64 {
		return float64(prefix*(G*P-misses)) / float64((prefix+question)*G*P)
	}
	rrMisses := 0
	for g := 0; g < G; g++ {
		seen := map[int]bool{}
		for p := 0; p < P; p++ {
			seen[(p*G+g)%R] = true
		}
		rrMisses += len(seen)
	}
	tests := []struct {
		policy string
		misses int
	}{
		{"round-robin", rrMisses},
		{"kv-aware", G},
		{"kv-aware-precise", G},
		{"dynamo-kv", G},
		{"sglang-cache-aware", G},
		{"llm-d", G},
		{"aibrix-prefix", G},
		{"mooncake", G},
		{"chwbl", G},
	}
	for _, tc := range tests {
		t.Run(tc.policy, func(t *testing.T) {
			o, err := simulate(Config{Requests: reqs, Replicas: R, Policies: []string{tc.policy}})
			if err != nil {
				t.Fatal(err)
			}
			got, want := hitRate(o.runs[0]), rate(tc.misses)
			if fmt.Sprintf("%.6f", got) != fmt.Sprintf("%.6f", want) {
				t.Errorf("hit rate %.6f, want %.6f (%d misses)", got, want, tc.misses)
			}
		})
	}
}

// smallWorkloads are every generated workload, cut small.
func smallWorkloads(t *testing.T) []*trace.Workload {
	t.Helper()
	var ws []*trace.Workload
	for _, name := range trace.Names() {
		switch name {
		case "mooncake-conversation", "azure-conv", "azure-code":
			continue // trace files: BenchmarkMooncake and the command cover them
		}
		w, err := trace.Generate(name, trace.GenOptions{Seed: 1, Requests: 150, Groups: 8, PerGroup: 8})
		if err != nil {
			t.Fatal(err)
		}
		if len(w.Requests) > 150 {
			w.Requests = w.Requests[:150]
		}
		ws = append(ws, w)
	}
	return ws
}

// TestInvariants runs every policy on every generated workload: every
// request is served or counted as rejected, and no policy's hit rate
// exceeds the infinite-cache oracle.
func TestInvariants(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every policy on every workload")
	}
	for _, w := range smallWorkloads(t) {
		t.Run(w.Name, func(t *testing.T) {
			o, err := simulate(Config{Requests: w.Requests, Fleet: w.Events, Replicas: 4, Load: 0.8, Policies: allPolicies()})
			if err != nil {
				t.Fatal(err)
			}
			inf := float64(o.infinite.Cached) / float64(o.infinite.Prompt)
			pooled := float64(o.pooled.Cached) / float64(o.pooled.Prompt)
			if pooled > inf+1e-12 {
				t.Errorf("pooled oracle %.4f > infinite %.4f", pooled, inf)
			}
			for i, res := range o.runs {
				ok, rej, errs := res.counts()
				if ok+rej+errs != len(w.Requests) {
					t.Errorf("%s: %d served + %d rejected + %d errors, want %d requests", o.names[i], ok, rej, errs, len(w.Requests))
				}
				if len(res.samples) != len(w.Requests) {
					t.Errorf("%s: %d samples, want one per request (%d)", o.names[i], len(res.samples), len(w.Requests))
				}
				if h := hitRate(res); h > inf+1e-12 {
					t.Errorf("%s: hit rate %.4f > infinite oracle %.4f", o.names[i], h, inf)
				}
				if w.Name == "failure" && errs != 0 {
					t.Errorf("%s: %d errors; want none: the requests of the killed replica continue on another (continue.go)", o.names[i], errs)
				}
			}
		})
	}
}

// TestKVAwareBeatsRoundRobin compares hit rates: placement decides them
// (round-robin spreads each prefix or session over every replica, kv-aware
// keeps it where it is cached), so the comparison is robust to the timing
// noise of small runs, unlike a TTFT percentile.
func TestKVAwareBeatsRoundRobin(t *testing.T) {
	for _, name := range []string{"shared-prefix", "multi-turn-chat"} {
		t.Run(name, func(t *testing.T) {
			w, err := trace.Generate(name, trace.GenOptions{Seed: 1, Requests: 400, Groups: 16, PerGroup: 16})
			if err != nil {
				t.Fatal(err)
			}
			o, err := simulate(Config{Requests: w.Requests, Replicas: 4, Load: 0.7, Policies: []string{"round-robin", "kv-aware"}})
			if err != nil {
				t.Fatal(err)
			}
			rr, kv := hitRate(o.runs[0]), hitRate(o.runs[1])
			if kv <= rr {
				t.Errorf("kv-aware hit rate %.3f <= round-robin %.3f", kv, rr)
			}
		})
	}
}

var update = flag.Bool("update", false, "rewrite the golden summaries under testdata/")

// goldenCases are two small runs whose summaries are pinned under
// testdata/: any change in the engine model, a policy or the simulator
// that moves a figure shows up as a diff (refresh with -update after
// checking it is intended).
var goldenCases = []struct {
	file     string
	workload string
	opt      trace.GenOptions
	replicas int
	load     float64
	policies []string
}{
	{"shared-prefix.json", "shared-prefix", trace.GenOptions{Seed: 1, Groups: 8, PerGroup: 8}, 4, 0.8,
		[]string{"round-robin", "least-loaded", "kv-aware", "kv-aware-precise", "dynamo-kv", "llm-d"}},
	{"failure.json", "failure", trace.GenOptions{Seed: 2, Requests: 300}, 4, 0.8,
		[]string{"round-robin", "session-hash", "kv-aware", "sglang-cache-aware"}},
}

func runJSON(t *testing.T, workload string, opt trace.GenOptions, replicas int, load float64, policies []string) []byte {
	t.Helper()
	w, err := trace.Generate(workload, opt)
	if err != nil {
		t.Fatal(err)
	}
	preset, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	run, err := Run(Config{Workload: workload, Requests: w.Requests, Fleet: w.Events, Replicas: replicas,
		PresetName: "llama3-8b-h100", Preset: preset, Load: load, Policies: policies, Seed: opt.Seed,
		KVEventDelay: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := report.WriteJSON(&buf, &run); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestGolden compares two small runs' JSON summaries with testdata/.
func TestGolden(t *testing.T) {
	for _, gc := range goldenCases {
		t.Run(gc.file, func(t *testing.T) {
			got := runJSON(t, gc.workload, gc.opt, gc.replicas, gc.load, gc.policies)
			path := filepath.Join("testdata", gc.file)
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if diff := cmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("summary differs from %s (-want +got):\n%s", path, diff)
			}
		})
	}
}

// TestDeterministic runs one simulation twice: same seed, same bytes.
func TestDeterministic(t *testing.T) {
	gc := goldenCases[0]
	a := runJSON(t, gc.workload, gc.opt, gc.replicas, gc.load, allPolicies())
	b := runJSON(t, gc.workload, gc.opt, gc.replicas, gc.load, allPolicies())
	if !bytes.Equal(a, b) {
		t.Errorf("two runs with one seed differ:\n%s", cmp.Diff(string(a), string(b)))
	}
}

// TestModels: on a fleet of two models, every policy sends every request
// to a replica serving its model (a replica without it would answer an
// error), and no block is shared across models.
func TestModels(t *testing.T) {
	w, err := trace.Generate("multi-turn-chat", trace.GenOptions{Seed: 1, Requests: 200})
	if err != nil {
		t.Fatal(err)
	}
	o, err := simulate(Config{Requests: w.Requests, Replicas: 4, Models: 2, Load: 0.7, Policies: allPolicies()})
	if err != nil {
		t.Fatal(err)
	}
	for i, res := range o.runs {
		if ok, rej, errs := res.counts(); errs != 0 || rej != 0 || ok != len(w.Requests) {
			t.Errorf("%s: %d served, %d rejected, %d errors; want all %d served", o.names[i], ok, rej, errs, len(w.Requests))
		}
	}
	one, err := simulate(Config{Requests: w.Requests, Replicas: 4, Load: 0.7, Policies: []string{"kv-aware"}})
	if err != nil {
		t.Fatal(err)
	}
	if o.infinite.Cached > one.infinite.Cached {
		t.Errorf("two models share more blocks (%d cached) than one (%d)", o.infinite.Cached, one.infinite.Cached)
	}
}

// TestLearnedSpeedsOnEqualReplicas: 16 replicas of the preset, which the
// engine model runs at exactly the preset's rates, on multi-tenant-context
// with a CPU tier: what the router learns of each replica's prefill and
// decode speed stays within 15% of the preset's. (Near-full hits, whose
// time is mostly not compute, once taught all 16 a prefill 10 to 20 times
// slower than their own.)
func TestLearnedSpeedsOnEqualReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("a 6,585-request run")
	}
	preset, err := engine.Preset("llama3-8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	preset.CPUBlocks = 112640
	w, err := trace.Generate("multi-tenant-context", trace.GenOptions{Seed: 1, FleetKVTokens: FleetKVTokens(preset, 16)})
	if err != nil {
		t.Fatal(err)
	}
	run, err := Run(Config{Workload: "multi-tenant-context", Requests: w.Requests, Replicas: 16, PresetName: "llama3-8b-h100",
		Preset: preset, Load: 0.95, Policies: []string{"kv-aware"}, Seed: 1, KVEventDelay: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	learned := run.Policies[0].Learned
	if len(learned) != 16 {
		t.Fatalf("learned %d replicas, want 16", len(learned))
	}
	for i, l := range learned {
		if math.Abs(l.Scale-1) > 0.15 || math.Abs(l.DecodeScale-1) > 0.15 {
			t.Errorf("replica %d learned Scale %.3f, DecodeScale %.3f: want both within 15%% of 1", i, l.Scale, l.DecodeScale)
		}
	}
}

package fleet

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/scrape"
)

// TestIncrementalSnapshot: the snapshot Decide keeps in its Scratch and
// rewrites incrementally is, at every decision, the one a full Snapshot
// gives at that moment (with Decide's exclusions applied), through a
// seeded mix of everything that changes a replica: decisions, first
// tokens, completions, scrapes, health, models, TTFT calibration (which
// moves the prior scale), a new replica, another block size, a window.
func TestIncrementalSnapshot(t *testing.T) {
	for _, window := range []bool{false, true} {
		t.Run(fmt.Sprintf("window=%v", window), func(t *testing.T) {
			const seed = 7
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, 0))
			ids := make([]string, 70) // more than one bitset word
			for i := range ids {
				ids[i] = fmt.Sprintf("http://r%d:8000", i)
			}
			var f *Fleet
			var exclude []int
			var model string
			compared := 0
			check := route.Func(func(r *route.Request, s *route.Snapshot) route.Decision {
				var want route.Snapshot
				f.Snapshot(&want, t0.Add(time.Duration(r.Seq)*time.Second), s.BlockSize)
				var c snapCache
				f.excludeModel(model, &want, &c)
				for _, i := range exclude {
					want.Replicas[i].Healthy = false
				}
				if d := cmp.Diff(want, *s, cmpopts.IgnoreFields(route.Snapshot{}, "Summary")); d != "" {
					t.Fatalf("decision %d: incremental snapshot differs from a full one (-full +incremental):\n%s", r.Seq, d)
				}
				if s.Summary == nil {
					t.Fatalf("decision %d: no Summary kept for a policy that asks for one", r.Seq)
				}
				if err := s.Summary.Check(s); err != nil {
					t.Fatalf("decision %d: %v", r.Seq, err)
				}
				compared++
				rr := *r
				rr.Costs = make([]route.Cost, 0, len(s.Replicas))
				if d := cmp.Diff(route.KVAware{}.Pick(&rr, &want), route.KVAware{}.Pick(r, s)); d != "" {
					t.Fatalf("decision %d: kv-aware decides otherwise on the kept Summary (-derived +kept):\n%s", r.Seq, d)
				}
				return route.KVAware{}.Pick(r, s)
			})
			var p route.Policy = calibrating{check}
			if window {
				p = windowedCal{check}
			}
			f = newFleet(t, Config{Replicas: reps(ids[:60]...), MaxReplicas: len(ids), Policy: p})
			var sc Scratch
			var open []*Ticket
			for i := range 600 {
				now := t0.Add(time.Duration(i) * time.Second) // Seq is i: the policy's now
				id := ids[rng.IntN(f.Len())]
				switch k := rng.IntN(10); {
				case k < 2:
					f.SetLoad(id, scrape.Load{Running: rng.IntN(8), Waiting: rng.IntN(4), KVUsage: rng.Float64(),
						BlockSize: 16, NumBlocks: 1000 + rng.IntN(3), At: now.Add(-time.Duration(rng.IntN(900)) * time.Millisecond)})
				case k < 3:
					f.SetHealthy(id, rng.IntN(3) > 0)
				case k < 4 && len(open) > 0:
					j := rng.IntN(len(open))
					open[j].FirstToken(now)
					if rng.IntN(2) == 0 {
						open[j].Done(now, Usage{PromptTokens: 100, CachedTokens: 10, CompletionTokens: 2 + rng.IntN(40)}, nil)
						open = append(open[:j], open[j+1:]...)
					}
				case k < 5 && i%50 == 0:
					f.SetModels(id, []scrape.Model{{ID: []string{"m", "n"}[rng.IntN(2)]}})
				case k < 6 && f.Len() < len(ids) && i > 300:
					if err := f.AddReplica(Replica{ID: ids[f.Len()]}); err != nil {
						t.Fatal(err)
					}
				}
				exclude = exclude[:0]
				for range rng.IntN(3) {
					exclude = append(exclude, rng.IntN(f.Len()))
				}
				model = []string{"", "m", "n"}[rng.IntN(3)]
				tokens := []int{16, 32}[min(rng.IntN(8), 1)] // mostly one block size
				chains := []residency.Chain{{Tokens: tokens, Hashes: []prefix.Hash{1, prefix.Hash(2 + rng.IntN(5))}}}
				req := &Request{ID: fmt.Sprint(i), Hash: uint64(i), Model: model, Tokens: 500 + rng.IntN(2000),
					MaxTokens: 50, Chains: chains, TTFT: true}
				_, tk := f.Decide(req, exclude, now, &sc)
				if tk == nil {
					continue
				}
				if rng.IntN(3) == 0 { // calibrates the replica: the prior moves
					tk.FirstToken(now.Add(tk.Claim().PredictedTTFT * time.Duration(1+rng.IntN(3))))
				}
				open = append(open, tk)
			}
			if compared < 500 {
				t.Errorf("%d decisions compared, want ≥ 500", compared)
			}
		})
	}
}

// calibrating and windowedCal ask for calibration (and a window) over a
// test policy.
type calibrating struct{ route.Func }

func (calibrating) Needs() route.Needs {
	return route.Needs{Index: route.Approximate, Calibrate: true, Summarize: true, StaleAfter: time.Second}
}

type windowedCal struct{ route.Func }

func (windowedCal) Needs() route.Needs {
	return route.Needs{Index: route.Approximate, Calibrate: true, Window: 30 * time.Second, Summarize: true, StaleAfter: time.Second}
}

// TestDecideAllocs: a decision over a reused Scratch allocates nothing but
// its ticket (the first token's calibration publishes the replica's rates
// anew: one more).
func TestDecideAllocs(t *testing.T) {
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = fmt.Sprintf("http://r%d:8000", i)
	}
	f := newFleet(t, Config{Replicas: reps(ids...), Policy: route.KVAware{}})
	chains := []residency.Chain{{Tokens: 16, Hashes: []prefix.Hash{1, 2, 3}}}
	req := &Request{ID: "r", Tokens: 1000, MaxTokens: 10, Chains: chains, TTFT: true}
	var sc Scratch
	now := t0
	allocs := testing.AllocsPerRun(200, func() {
		now = now.Add(time.Millisecond)
		_, tk := f.Decide(req, []int{3}, now, &sc)
		tk.FirstToken(now.Add(time.Millisecond))
		tk.Done(now, NoUsage, nil)
	})
	if allocs > 2 {
		t.Errorf("Decide, FirstToken, Done: %v allocs, want ≤ 2 (the ticket, the rates)", allocs)
	}
}

// TestScrapeLessFinished: a scrape counts the router's requests in flight
// when it was taken; one of them that finished since is taken off its
// Running (not its KV usage: what it shared stays in use) until the next
// scrape, and a request sent after the scrape, which it never counted, is
// not.
func TestScrapeLessFinished(t *testing.T) {
	f := newFleet(t, Config{})
	a := f.reps[0].id
	claim := Claim{PrefillTokens: 100, Tokens: 1600}
	before := make([]*Ticket, 3)
	for i := range before {
		before[i], _ = f.Acquire(a, claim, t0)
	}
	at := t0.Add(10 * time.Millisecond)
	f.SetLoad(a, scrape.Load{Running: 3, KVUsage: 0.5, BlockSize: 16, NumBlocks: 1000, At: at})
	after, _ := f.Acquire(a, claim, at.Add(time.Millisecond))
	seen := func() (int, float64) {
		var s route.Snapshot
		f.Snapshot(&s, at.Add(time.Second), 16)
		return s.Replicas[0].Running, s.Replicas[0].KVUsage
	}
	if run, kv := seen(); run != 3 || kv != 0.5 {
		t.Fatalf("before any finished: Running %d, KVUsage %v; want the scrape's 3, 0.5", run, kv)
	}
	before[0].FirstToken(at.Add(20 * time.Millisecond))
	before[0].Done(at.Add(30*time.Millisecond), NoUsage, nil)
	after.Done(at.Add(40*time.Millisecond), NoUsage, nil) // never in the scrape
	if run, kv := seen(); run != 2 || kv != 0.5 {
		t.Fatalf("one counted request finished: Running %d, KVUsage %v; want 2, 0.5", run, kv)
	}
	for _, tk := range before[1:] {
		tk.Done(at.Add(50*time.Millisecond), NoUsage, errors.New("canceled"))
	}
	f.SetLoad(a, scrape.Load{Running: 1, KVUsage: 0.2, BlockSize: 16, NumBlocks: 1000, At: at.Add(time.Second)})
	if run, kv := seen(); run != 1 || kv != 0.2 {
		t.Fatalf("after the next scrape: Running %d, KVUsage %v; want its own 1, 0.2", run, kv)
	}

	// A request that finished while a scrape was on its way (after it was
	// sent, before it was applied) may be in its Running: it is taken off
	// too; one that finished before the scrape was sent is not.
	asked := at.Add(2 * time.Second)
	early, _ := f.Acquire(a, claim, asked.Add(-time.Second))
	late, _ := f.Acquire(a, claim, asked.Add(-time.Second))
	early.Done(asked.Add(-time.Millisecond), NoUsage, nil)
	late.Done(asked.Add(time.Millisecond), NoUsage, nil)
	f.SetLoad(a, scrape.Load{Running: 2, BlockSize: 16, NumBlocks: 1000, Asked: asked, At: asked.Add(2 * time.Millisecond)})
	if run, _ := seen(); run != 1 {
		t.Fatalf("one request finished while the scrape was on its way, one before: Running %d, want the scrape's 2 less 1", run)
	}
}

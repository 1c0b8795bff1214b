package fleet

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/scrape"
)

// BenchmarkSnapshot measures filling a reused snapshot, per fleet size,
// without and with the recent-prefill window some peer policies ask for:
// in full (Snapshot), and incrementally as Decide does (refresh over a
// Scratch's cache) after one replica's counts changed, every replica
// scraped:
//
//	go test -run='^$' -bench=Snapshot -benchmem ./fleet
func BenchmarkSnapshot(b *testing.B) {
	for _, inc := range []bool{false, true} {
		for _, w := range []bool{false, true} {
			for _, n := range []int{8, 64, 512, 1000} {
				b.Run(fmt.Sprintf("incremental=%v/window=%v/replicas=%d", inc, w, n), func(b *testing.B) {
					benchSnapshot(b, n, w, inc)
				})
			}
		}
	}
}

func benchSnapshot(b *testing.B, n int, window, incremental bool) {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("http://10.0.%d.%d:8000", i/256, i%256)
	}
	var p route.Policy = route.KVAware{}
	if window {
		p = windowed{pick(0, 0).(route.Func)}
	}
	f := newFleet(b, Config{Replicas: reps(ids...), Policy: p})
	for _, id := range ids {
		f.SetLoad(id, scrape.Load{Running: 3, Waiting: 1, KVUsage: 0.5, At: t0})
	}
	var s route.Snapshot
	var c snapCache
	k := 0
	b.ReportAllocs()
	for b.Loop() {
		tk, _ := f.Acquire(ids[k%n], Claim{PrefillTokens: 100, Tokens: 200}, t0)
		tk.Done(t0, NoUsage, nil)
		k++
		if incremental {
			f.refresh(&s, &c, t0, 16)
		} else {
			f.Snapshot(&s, t0, 16)
		}
	}
}

// BenchmarkCommit measures the bookkeeping of one routed request around
// the policy: Decide (snapshot, pin, match, a policy that costs nothing,
// commit with a session), FirstToken and Done, on 3 replicas.
//
//	go test -run='^$' -bench=Commit -benchmem ./fleet
func BenchmarkCommit(b *testing.B) {
	f := newFleet(b, Config{Policy: pick(1, 512)})
	var sc Scratch
	req := &Request{ID: "r", Tokens: 1000, MaxTokens: 100, Session: "session-1"}
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Millisecond)
		_, tk := f.Decide(req, nil, now, &sc)
		tk.FirstToken(now)
		tk.Done(now, Usage{PromptTokens: 1000, CachedTokens: 512}, nil)
	}
}

// BenchmarkDecide measures the fleet's share of a decision, per fleet
// size: Decide over a reused Scratch (the incremental snapshot, match,
// pin, commit) with a policy that costs nothing, then FirstToken and Done,
// on a warm index (64 prompts sharing a prefix, each routed once):
//
//	go test -run='^$' -bench=Decide -benchmem ./fleet
func BenchmarkDecide(b *testing.B) {
	for _, n := range []int{8, 64, 1000} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			ids := make([]string, n)
			for i := range ids {
				ids[i] = fmt.Sprintf("http://10.0.%d.%d:8000", i/256, i%256)
			}
			var k int
			spread := route.Func(func(r *route.Request, s *route.Snapshot) route.Decision {
				return route.Decision{Replica: int(r.Hash % uint64(len(s.Replicas))), Reason: "test"}
			})
			f := newFleet(b, Config{Replicas: reps(ids...), Policy: calibrating{spread}})
			chains := make([][]residency.Chain, 64)
			for i := range chains {
				chains[i] = []residency.Chain{{Tokens: 16, Hashes: []prefix.Hash{1, 2, 3, 4, prefix.Hash(100 + i)}}}
			}
			var sc Scratch
			now := t0
			decide := func() {
				now = now.Add(time.Millisecond)
				req := &Request{ID: "r", Hash: uint64(k * 7919), Tokens: 1000, MaxTokens: 100, Chains: chains[k%len(chains)]}
				_, tk := f.Decide(req, nil, now, &sc)
				tk.FirstToken(now)
				tk.Done(now, NoUsage, nil)
				k++
			}
			for range chains {
				decide()
			}
			b.ReportAllocs()
			for b.Loop() {
				decide()
			}
		})
	}
}

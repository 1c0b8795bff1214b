package peers

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/internal/redisserver"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/scrape"
)

// BenchmarkDecideShared measures one decision (Decide, then Done) of the
// kv-aware policy on 64 replicas, without shared state and with it: a
// Syncer on a real redis-server exchanging with a second router every 50
// ms, whose load and blocks the decisions merge. It reports the p50 and
// p99 of the decisions' times beside ns/op; the difference of the p50s is
// what sharing adds to the request path (target ≤ 20 µs; all Redis I/O is
// on the Syncer's goroutine):
//
//	go test -run='^$' -bench=DecideShared -benchmem ./peers
func BenchmarkDecideShared(b *testing.B) {
	for _, shared := range []bool{false, true} {
		b.Run(fmt.Sprintf("shared=%v/replicas=64", shared), func(b *testing.B) { benchDecide(b, 64, shared) })
	}
}

func benchDecide(b *testing.B, n int, shared bool) {
	ids := make([]fleet.Replica, n)
	for i := range ids {
		ids[i] = fleet.Replica{ID: fmt.Sprintf("http://10.0.%d.%d:8000", i/256, i%256)}
	}
	start := time.Now()
	mk := func() *fleet.Fleet {
		f, err := fleet.New(fleet.Config{Replicas: ids, Start: start, CacheBlocks: 4096})
		if err != nil {
			b.Fatal(err)
		}
		for _, r := range ids {
			f.SetLoad(r.ID, scrape.Load{Running: 3, Waiting: 1, KVUsage: 0.5, BlockSize: 16, NumBlocks: 4096, At: start})
		}
		return f
	}
	f := mk()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	if shared {
		rs := redisserver.Start(b)
		other := mk()
		sa, err := New(Config{Settings: Settings{URL: rs.URL(), Router: "bench", Interval: 50 * time.Millisecond}}, f)
		if err != nil {
			b.Fatal(err)
		}
		so, err := New(Config{Settings: Settings{URL: rs.URL(), Router: "other", Interval: 50 * time.Millisecond}}, other)
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() { sa.Run(ctx) })
		wg.Go(func() { so.Run(ctx) })
		// The other router keeps some load and routes blocks.
		wg.Go(func() { otherTraffic(ctx, other) })
		wait.For(b, "the router up with its peer", func() bool { return sa.Up() && sa.Peers() == 1 })
	}
	hashes := make([]prefix.Hash, 64)
	chains := []residency.Chain{{Tokens: 16, Hashes: hashes}}
	var sc fleet.Scratch
	req := &fleet.Request{Tokens: 1024, MaxTokens: 128, Chains: chains}
	times := make([]time.Duration, 0, 1<<16)
	k := 0
	b.ReportAllocs()
	for b.Loop() {
		k++
		for i := range hashes {
			hashes[i] = prefix.Hash(uint64(k%512)<<32 | uint64(i))
		}
		req.ID, req.Hash, req.Session = "r", uint64(k), fmt.Sprint("s", k%1000)
		t0 := time.Now()
		_, tk := f.Decide(req, nil, t0, &sc)
		d := time.Since(t0)
		tk.Done(t0, fleet.NoUsage, nil)
		if len(times) < cap(times) {
			times = append(times, d)
		}
	}
	slices.Sort(times)
	if len(times) > 0 {
		b.ReportMetric(float64(times[len(times)/2].Nanoseconds()), "p50-ns")
		b.ReportMetric(float64(times[len(times)*99/100].Nanoseconds()), "p99-ns")
	}
}

// otherTraffic routes a request every millisecond on f, holding 32 in
// flight.
func otherTraffic(ctx context.Context, f *fleet.Fleet) {
	var sc fleet.Scratch
	var held []*fleet.Ticket
	hashes := make([]prefix.Hash, 64)
	for k := 0; ctx.Err() == nil; k++ {
		for i := range hashes {
			hashes[i] = prefix.Hash(uint64(k%512)<<32 | uint64(i) | 1<<60)
		}
		req := &fleet.Request{ID: "o", Hash: uint64(k), Tokens: 1024, MaxTokens: 128, Session: fmt.Sprint("o", k%1000),
			Chains: []residency.Chain{{Tokens: 16, Hashes: hashes}}}
		_, tk := f.Decide(req, nil, time.Now(), &sc)
		held = append(held, tk)
		if len(held) > 32 {
			held[0].Done(time.Now(), fleet.NoUsage, nil)
			held = held[1:]
		}
		time.Sleep(time.Millisecond) // the other router's request rate
	}
}

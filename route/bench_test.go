package route

import (
	"fmt"
	"testing"
	"time"
)

// benchFleet builds a deterministic n-replica snapshot and a request with a
// 64-block prompt matched to varying depths on every eighth replica. The
// snapshot carries its Summary, as the fleet's Decide keeps it.
func benchFleet(n int) (*Request, *Snapshot) {
	s := &Snapshot{BlockSize: 16, Replicas: make([]Replica, n)}
	r := &Request{ID: "bench", Hash: 0x1234567, Tokens: 1030, Blocks: 64, Pinned: 3, Session: 99, PrefixKey: 42,
		Match: make([]int, n), Age: make([]time.Duration, n), Costs: make([]Cost, 0, n)}
	for i := range s.Replicas {
		h := Mix64(uint64(i))
		s.Replicas[i] = Replica{
			ID: fmt.Sprintf("http://10.0.%d.%d:8000", i/256, i%256), Healthy: h%17 != 0,
			Running: int(h % 40), Waiting: int(h>>8) % 6, KVUsage: float64(h>>16%100) / 100, Scraped: true,
			LoadAge: 50 * time.Millisecond, InFlight: int(h>>24) % 40, PrefillTokens: int(h>>32) % 8000,
			Decoding: int(h>>40) % 20, DecodeBlocks: int(h>>44) % 20000, RecentPrefill: int(h>>48) % 50000,
			CacheBlocks: 28000, IndexBlocks: int(h>>20) % 28000, Rates: Rates{Horizon: 10 * time.Minute, Scale: 0.8 + float64(h>>52%400)/1000},
		}
		if i%8 == 0 {
			r.Match[i] = int(h>>4) % 65
			r.Age[i] = time.Duration(h>>12%600) * time.Second
		}
	}
	s.Summary = NewSummary(0)
	s.Summary.fill(s)
	return r, s
}

// BenchmarkPick measures one decision per policy and fleet size. Run with:
//
//	go test -run='^$' -bench=Pick -benchmem -count=10 ./route > new.txt
//
// Target for kv-aware: 0 allocs/op and ≤ 10 µs at 1,000 replicas.
func BenchmarkPick(b *testing.B) {
	for _, name := range Names() {
		p, err := New(name)
		if err != nil {
			b.Fatal(err)
		}
		for _, n := range []int{8, 64, 512, 1000} {
			b.Run(fmt.Sprintf("policy=%s/replicas=%d", name, n), func(b *testing.B) {
				r, s := benchFleet(n)
				b.ReportAllocs()
				for b.Loop() {
					r.Seq++
					p.Pick(r, s)
				}
			})
		}
	}
}

// BenchmarkPickNoCosts is BenchmarkPick for kv-aware without recording each
// candidate's cost terms (Request.Costs nil), the decision alone:
//
//	go test -run='^$' -bench=PickNoCosts -benchmem -count=5 ./route
func BenchmarkPickNoCosts(b *testing.B) {
	for _, n := range []int{8, 64, 512, 1000} {
		b.Run(fmt.Sprintf("policy=kv-aware/replicas=%d", n), func(b *testing.B) {
			r, s := benchFleet(n)
			r.Costs = nil
			p := KVAware{}
			b.ReportAllocs()
			for b.Loop() {
				r.Seq++
				p.Pick(r, s)
			}
		})
	}
}

// BenchmarkPickNoSummary is BenchmarkPick for kv-aware on a snapshot that
// carries no Summary, so that every Pick derives its own from every
// replica (a caller that does not keep one):
//
//	go test -run='^$' -bench=PickNoSummary -benchmem -count=5 ./route
func BenchmarkPickNoSummary(b *testing.B) {
	for _, n := range []int{8, 64, 512, 1000} {
		b.Run(fmt.Sprintf("policy=kv-aware/replicas=%d", n), func(b *testing.B) {
			r, s := benchFleet(n)
			s.Summary = nil
			p := KVAware{}
			b.ReportAllocs()
			for b.Loop() {
				r.Seq++
				p.Pick(r, s)
			}
		})
	}
}

// BenchmarkPickIdleFleet is kv-aware on 1,000 idle replicas that differ in
// nothing: no queue, no batch, no match, Scale 1 (a fleet at start, before
// any calibration). Every candidate costs the same, so only the tie-break
// tells them apart:
//
//	go test -run='^$' -bench=PickIdleFleet -benchmem -count=5 ./route
func BenchmarkPickIdleFleet(b *testing.B) {
	s := &Snapshot{BlockSize: 16, Replicas: make([]Replica, 1000)}
	for i := range s.Replicas {
		s.Replicas[i] = Replica{ID: fmt.Sprintf("r%d", i), Healthy: true, Scraped: true, LoadAge: 50 * time.Millisecond, CacheBlocks: 28000}
	}
	s.Summary = NewSummary(0)
	s.Summary.fill(s)
	r := &Request{ID: "bench", Hash: 0x1234567, Tokens: 1030, Blocks: 64, Pinned: -1, Costs: make([]Cost, 0, 1000)}
	b.ReportAllocs()
	for b.Loop() {
		r.Seq++
		r.Hash++
		KVAware{}.Pick(r, s)
	}
}

// BenchmarkPickSLO is BenchmarkPick for kv-aware with a request that
// carries an SLO, so that every candidate priced in full also prices its
// misses (kvmiss.go):
//
//	go test -run='^$' -bench=PickSLO -benchmem -count=5 ./route
func BenchmarkPickSLO(b *testing.B) {
	for _, n := range []int{8, 64, 512, 1000} {
		b.Run(fmt.Sprintf("policy=kv-aware/replicas=%d", n), func(b *testing.B) {
			r, s := benchFleet(n)
			r.SLO = SLO{TTFT: 500 * time.Millisecond, ITL: 40 * time.Millisecond}
			p := KVAware{}
			b.ReportAllocs()
			for b.Loop() {
				r.Seq++
				p.Pick(r, s)
			}
		})
	}
}

package fleet

import (
	"fmt"
	"testing"
	"time"

	"kvrouter/route"
)

// BenchmarkSnapshot measures filling a reused snapshot, per fleet size,
// without and with the recent-prefill window some peer policies ask for:
//
//	go test -run='^$' -bench=Snapshot -benchmem ./fleet
func BenchmarkSnapshot(b *testing.B) {
	for _, w := range []bool{false, true} {
		for _, n := range []int{8, 64, 512, 1000} {
			b.Run(fmt.Sprintf("window=%v/replicas=%d", w, n), func(b *testing.B) {
				ids := make([]string, n)
				for i := range ids {
					ids[i] = fmt.Sprintf("http://10.0.%d.%d:8000", i/256, i%256)
				}
				var p route.Policy = route.KVAware{}
				if w {
					p = windowed{pick(0, 0).(route.Func)}
				}
				f := newFleet(b, Config{Replicas: reps(ids...), Policy: p})
				var s route.Snapshot
				b.ReportAllocs()
				for b.Loop() {
					f.Snapshot(&s, t0, 16)
				}
			})
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
		tk.Done(Usage{PromptTokens: 1000, CachedTokens: 512}, nil)
	}
}

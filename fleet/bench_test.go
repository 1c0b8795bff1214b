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
	for _, window := range []time.Duration{0, 10 * time.Second} {
		for _, n := range []int{8, 64, 512, 1000} {
			b.Run(fmt.Sprintf("window=%v/replicas=%d", window, n), func(b *testing.B) {
				ids := make([]string, n)
				for i := range ids {
					ids[i] = fmt.Sprintf("http://10.0.%d.%d:8000", i/256, i%256)
				}
				f, err := New(Config{Replicas: ids, Window: window})
				if err != nil {
					b.Fatal(err)
				}
				var s route.Snapshot
				now := time.Now()
				b.ReportAllocs()
				for b.Loop() {
					f.Snapshot(&s, now)
				}
			})
		}
	}
}

// BenchmarkCommit measures the bookkeeping of one routed request: Commit
// with a session, FirstToken and Done.
//
//	go test -run='^$' -bench=Commit -benchmem ./fleet
func BenchmarkCommit(b *testing.B) {
	f, err := New(Config{Replicas: []string{a, b2, c}, Window: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	var s route.Snapshot
	f.Snapshot(&s, time.Now())
	req := &route.Request{Tokens: 1000, MaxTokens: 100}
	d := route.Decision{Replica: 1, Matched: 512}
	b.ReportAllocs()
	for b.Loop() {
		tk, err := f.Commit(&s, req, d, "session-1")
		if err != nil {
			b.Fatal(err)
		}
		tk.FirstToken()
		tk.Done(512, nil)
	}
}

const b2 = "http://127.0.0.1:8002"

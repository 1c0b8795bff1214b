package fleet

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"kvrouter/route"
	"kvrouter/scrape"
)

const (
	a = "http://127.0.0.1:8001"
	b = "http://127.0.0.1:8002"
	c = "http://127.0.0.1:8003"
)

func newFleet(t *testing.T, cfg Config) *Fleet {
	t.Helper()
	if cfg.Replicas == nil {
		cfg.Replicas = []string{a, b, c}
	}
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// counts is the router-owned accounting of one replica.
type counts struct{ InFlight, PrefillTokens, Decoding, DecodeBlocks int }

func countsOf(f *Fleet, i int) counts {
	var s route.Snapshot
	f.Snapshot(&s, time.Now())
	r := s.Replicas[i]
	return counts{r.InFlight, r.PrefillTokens, r.Decoding, r.DecodeBlocks}
}

func TestTicketPaths(t *testing.T) {
	claim := Claim{PrefillTokens: 300, Blocks: 25, PredictedCached: 100}
	tests := []struct {
		name string
		run  func(tk *Ticket)
	}{
		{"success", func(tk *Ticket) { tk.FirstToken(); tk.Done(100, nil) }},
		{"error before first token", func(tk *Ticket) { tk.Done(-1, errors.New("502")) }},
		{"cancel while decoding", func(tk *Ticket) { tk.FirstToken(); tk.Done(-1, errors.New("canceled")) }},
		{"done twice", func(tk *Ticket) { tk.FirstToken(); tk.Done(0, nil); tk.Done(0, nil) }},
		{"first token twice then done", func(tk *Ticket) { tk.FirstToken(); tk.FirstToken(); tk.Done(0, nil) }},
		{"first token after done", func(tk *Ticket) { tk.Done(0, nil); tk.FirstToken(); tk.Done(0, nil) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFleet(t, Config{})
			tk, err := f.Acquire(b, claim)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := countsOf(f, 1), (counts{1, 300, 0, 25}); got != want {
				t.Fatalf("after Acquire: got %+v, want %+v", got, want)
			}
			tt.run(tk)
			if got := countsOf(f, 1); got != (counts{}) {
				t.Errorf("after release: got %+v, want zero", got)
			}
		})
	}
}

func TestFirstTokenMovesPrefillToDecoding(t *testing.T) {
	f := newFleet(t, Config{})
	t1, _ := f.Acquire(a, Claim{PrefillTokens: 100, Blocks: 10})
	t2, _ := f.Acquire(a, Claim{PrefillTokens: 50, Blocks: 5})
	t1.FirstToken()
	if got, want := countsOf(f, 0), (counts{2, 50, 1, 15}); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	t1.Done(0, nil)
	t2.Done(0, nil)
	var nilTicket *Ticket
	nilTicket.FirstToken() // must not panic
	nilTicket.Done(0, nil)
	if _, err := f.Acquire("http://nowhere", Claim{}); !errors.Is(err, ErrUnknownReplica) {
		t.Errorf("Acquire unknown: err %v, want ErrUnknownReplica", err)
	}
}

func TestCommitAndPin(t *testing.T) {
	f := newFleet(t, Config{BlockSize: 16})
	var s route.Snapshot
	f.Snapshot(&s, time.Now())
	req := &route.Request{ID: "r1", Tokens: 1000, MaxTokens: 100}
	tk, err := f.Commit(&s, req, route.Decision{Replica: 2, Matched: 640}, "conv-1")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tk.Claim(), (Claim{PrefillTokens: 360, Blocks: 69, PredictedCached: 640}); got != want {
		t.Errorf("claim %+v, want %+v", got, want)
	}
	if got := f.Pin("conv-1", &s); got != 2 {
		t.Errorf("Pin = %d, want 2", got)
	}
	if got := f.Pin("other", &s); got != -1 {
		t.Errorf("Pin of unknown session = %d, want -1", got)
	}
	tk.FirstToken()
	tk.Done(600, nil)
	v := f.View(time.Now())
	rv := v.Replicas[2]
	if rv.PredictedCached != 640 || rv.ActualCached != 600 || rv.Completed != 1 || rv.Sessions != 1 || v.Sessions != 1 {
		t.Errorf("view %+v (sessions %d), want predicted 640, actual 600, 1 completed, 1 session", rv, v.Sessions)
	}
	if rv.PromptTokens != 0 {
		t.Errorf("prompt tokens %d after Done without usage, want 0", rv.PromptTokens)
	}
	tk2, err := f.Commit(&s, req, route.Decision{Replica: 2, Matched: 640}, "conv-1")
	if err != nil {
		t.Fatal(err)
	}
	tk2.DoneUsage(700, 1000, nil)
	tk2.DoneUsage(1, 1, nil) // only the first call counts
	if rv := f.View(time.Now()).Replicas[2]; rv.PromptTokens != 1000 || rv.UsageCached != 700 || rv.ActualCached != 1300 {
		t.Errorf("after DoneUsage(700, 1000): prompt %d, usage cached %d, actual %d; want 1000, 700, 1300",
			rv.PromptTokens, rv.UsageCached, rv.ActualCached)
	}
	if _, err := f.Commit(&s, req, route.Decision{Replica: -1, Reason: "no-healthy"}, ""); err == nil {
		t.Error("Commit of a rejection: no error")
	}
}

func TestSessions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t, Config{SessionTTL: time.Minute})
		var s route.Snapshot
		snap := func() *route.Snapshot { f.Snapshot(&s, time.Now()); return &s }

		f.Bind("s1", b)
		if got := f.Pin("s1", snap()); got != 1 {
			t.Fatalf("Pin = %d, want 1", got)
		}
		// Used again before expiry: stays bound.
		time.Sleep(50 * time.Second)
		f.Bind("s1", b)
		time.Sleep(50 * time.Second)
		if got := f.Pin("s1", snap()); got != 1 {
			t.Errorf("after 50 s idle: Pin = %d, want 1", got)
		}
		// Idle beyond the TTL: expired.
		time.Sleep(61 * time.Second)
		if got := f.Pin("s1", snap()); got != -1 {
			t.Errorf("after 61 s idle: Pin = %d, want -1", got)
		}
		if n := f.Sessions(); n != 0 {
			t.Errorf("expired session still stored: %d", n)
		}

		// Replica failure: unpinned, and the next commit re-binds.
		f.Bind("s2", b)
		f.SetHealthy(b, false)
		if got := f.Pin("s2", snap()); got != -1 {
			t.Errorf("bound replica unhealthy: Pin = %d, want -1", got)
		}
		tk, err := f.Commit(snap(), &route.Request{Tokens: 10}, route.Decision{Replica: 2}, "s2")
		if err != nil {
			t.Fatal(err)
		}
		tk.Done(0, nil)
		f.SetHealthy(b, true)
		if got := f.Pin("s2", snap()); got != 2 {
			t.Errorf("after re-bind: Pin = %d, want 2", got)
		}

		// Removal of an earlier replica shifts indices; removal of the bound
		// one unbinds.
		f.Bind("s3", c)
		if err := f.RemoveReplica(a); err != nil {
			t.Fatal(err)
		}
		if got := f.Pin("s3", snap()); got != 1 {
			t.Errorf("after removing a: Pin = %d, want 1", got)
		}
		if err := f.RemoveReplica(c); err != nil {
			t.Fatal(err)
		}
		if got := f.Pin("s3", snap()); got != -1 {
			t.Errorf("bound replica removed: Pin = %d, want -1", got)
		}
		if _, ok := f.PinID("s3"); ok {
			t.Error("session of a removed replica still bound")
		}
	})
}

func TestSweepBoundsSessions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t, Config{SessionTTL: time.Minute})
		for i := range 1000 {
			f.Bind(fmt.Sprint("old-", i), a)
		}
		time.Sleep(2 * time.Minute)
		f.Bind("new", a) // triggers a sweep
		if n := f.Sessions(); n != 1 {
			t.Errorf("after sweep: %d sessions, want 1", n)
		}
	})
}

func TestSnapshotContents(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		preset := route.Rates{PrefillPerToken: 50 * time.Microsecond, DecodeStep: 20 * time.Millisecond, MaxSeqs: 128}
		f := newFleet(t, Config{BlockSize: 16, CacheBlocks: 500, Window: 10 * time.Second, Rates: preset})
		scrapedAt := time.Now()
		f.SetLoad(a, scrape.Load{Running: 4, Waiting: 2, KVUsage: 0.5, BlockSize: 32, NumBlocks: 1000, At: scrapedAt})
		f.SetHealthy(c, false)
		t1, _ := f.Acquire(a, Claim{PrefillTokens: 1000, Blocks: 70})
		time.Sleep(6 * time.Second)
		t2, _ := f.Acquire(a, Claim{PrefillTokens: 200, Blocks: 13})
		t2.FirstToken()
		time.Sleep(time.Second)

		var s route.Snapshot
		f.Snapshot(&s, time.Now())
		want := route.Snapshot{BlockSize: 16, Replicas: []route.Replica{
			{ID: a, Healthy: true, Running: 4, Waiting: 2, KVUsage: 0.5, Scraped: true, LoadAge: 7 * time.Second,
				InFlight: 2, PrefillTokens: 1000, Decoding: 1, DecodeBlocks: 83, RecentPrefill: 1200,
				CacheBlocks: 2000, Rates: route.Rates{PrefillPerToken: 50 * time.Microsecond, DecodeStep: 20 * time.Millisecond, MaxSeqs: 128, Scale: 1}},
			{ID: b, Healthy: true, CacheBlocks: 500, Rates: route.Rates{PrefillPerToken: 50 * time.Microsecond, DecodeStep: 20 * time.Millisecond, MaxSeqs: 128, Scale: 1}},
			{ID: c, Healthy: false, CacheBlocks: 500, Rates: route.Rates{PrefillPerToken: 50 * time.Microsecond, DecodeStep: 20 * time.Millisecond, MaxSeqs: 128, Scale: 1}},
		}}
		if d := cmp.Diff(want, s); d != "" {
			t.Errorf("snapshot mismatch (-want +got):\n%s", d)
		}

		// The first prefill leaves the 10 s window.
		time.Sleep(4 * time.Second)
		f.Snapshot(&s, time.Now())
		if got := s.Replicas[0].RecentPrefill; got != 200 {
			t.Errorf("RecentPrefill after 11 s = %d, want 200", got)
		}
		t1.Done(0, nil)
		t2.Done(0, nil)

		allocs := testing.AllocsPerRun(100, func() { f.Snapshot(&s, time.Now()) })
		if allocs != 0 {
			t.Errorf("Snapshot into a reused dst: %v allocs, want 0", allocs)
		}
	})
}

func TestAddRemoveReplica(t *testing.T) {
	f := newFleet(t, Config{Replicas: []string{a}})
	if err := f.AddReplica(b); err != nil {
		t.Fatal(err)
	}
	if err := f.AddReplica(a); err == nil {
		t.Error("duplicate AddReplica: no error")
	}
	tk, _ := f.Acquire(a, Claim{PrefillTokens: 5, Blocks: 1})
	if err := f.RemoveReplica(a); err != nil {
		t.Fatal(err)
	}
	tk.Done(0, nil) // releases into the removed replica harmlessly
	if d := cmp.Diff([]string{b}, f.Replicas()); d != "" {
		t.Errorf("replicas (-want +got):\n%s", d)
	}
	if err := f.RemoveReplica(a); !errors.Is(err, ErrUnknownReplica) {
		t.Errorf("second RemoveReplica: %v, want ErrUnknownReplica", err)
	}
	if _, err := New(Config{Replicas: []string{a, a}}); err == nil {
		t.Error("New with duplicates: no error")
	}
}

// TestConcurrent hammers every method at once; run with -race. All counts
// must return to zero.
func TestConcurrent(t *testing.T) {
	f := newFleet(t, Config{Window: time.Second})
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			var s route.Snapshot
			for i := range 500 {
				f.Snapshot(&s, time.Now())
				d := route.Decision{Replica: (g + i) % len(s.Replicas), Matched: 16}
				sess := fmt.Sprint("s", i%20)
				d.Replica = max(d.Replica, f.Pin(sess, &s))
				tk, err := f.Commit(&s, &route.Request{Tokens: 100, MaxTokens: 10}, d, sess)
				if err != nil {
					continue // the replica may have been removed meanwhile
				}
				if i%3 != 0 {
					tk.FirstToken()
				}
				f.SetLoad(tk.Replica(), scrape.Load{Running: i, At: time.Now()})
				f.ObserveTTFT(tk.Replica(), 10*time.Millisecond, 15*time.Millisecond)
				tk.Done(i%50, nil)
				tk.Done(0, errors.New("again"))
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			f.SetHealthy(b, false)
			f.RemoveReplica(c)
			f.AddReplica(c)
			f.SetHealthy(b, true)
			_ = f.View(time.Now())
		}
	})
	wg.Wait()
	var s route.Snapshot
	f.Snapshot(&s, time.Now())
	for _, r := range s.Replicas {
		if r.InFlight != 0 || r.PrefillTokens != 0 || r.Decoding != 0 || r.DecodeBlocks != 0 {
			t.Errorf("%s: counts not released: %+v", r.ID, r)
		}
	}
}

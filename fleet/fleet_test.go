package fleet

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/scrape"
)

const (
	a = "http://127.0.0.1:8001"
	b = "http://127.0.0.1:8002"
	c = "http://127.0.0.1:8003"
)

// t0 is the tests' clock origin (and every fleet's Start).
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func reps(ids ...string) []Replica {
	out := make([]Replica, len(ids))
	for i, id := range ids {
		out[i] = Replica{ID: id}
	}
	return out
}

func newFleet(t testing.TB, cfg Config) *Fleet {
	t.Helper()
	if cfg.Replicas == nil {
		cfg.Replicas = reps(a, b, c)
	}
	cfg.Start = t0
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// pick is a policy that always chooses replica i with matched tokens.
func pick(i, matched int) route.Policy {
	return route.Func(func(r *route.Request, s *route.Snapshot) route.Decision {
		return route.Decision{Replica: i, Matched: matched, Reason: "test"}
	})
}

// counts is the router-owned accounting of one replica.
type counts struct{ InFlight, PrefillTokens, Decoding, DecodeBlocks int }

func countsOf(f *Fleet, i int) counts {
	var s route.Snapshot
	f.Snapshot(&s, t0, 16)
	r := s.Replicas[i]
	return counts{r.InFlight, r.PrefillTokens, r.Decoding, r.DecodeBlocks}
}

func TestTicketPaths(t *testing.T) {
	claim := Claim{PrefillTokens: 300, Tokens: 400, PredictedCached: 100}
	ok := Usage{PromptTokens: 400, CachedTokens: 100}
	tests := []struct {
		name string
		run  func(tk *Ticket)
	}{
		{"success", func(tk *Ticket) { tk.FirstToken(t0); tk.Done(t0, ok, nil) }},
		{"error before first token", func(tk *Ticket) { tk.Done(t0, NoUsage, errors.New("502")) }},
		{"cancel while decoding", func(tk *Ticket) { tk.FirstToken(t0); tk.Done(t0, NoUsage, errors.New("canceled")) }},
		{"done twice", func(tk *Ticket) { tk.FirstToken(t0); tk.Done(t0, ok, nil); tk.Done(t0, ok, nil) }},
		{"first token twice then done", func(tk *Ticket) { tk.FirstToken(t0); tk.FirstToken(t0); tk.Done(t0, ok, nil) }},
		{"first token after done", func(tk *Ticket) { tk.Done(t0, ok, nil); tk.FirstToken(t0); tk.Done(t0, ok, nil) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFleet(t, Config{})
			tk, err := f.Acquire(b, claim, t0)
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
	t1, _ := f.Acquire(a, Claim{PrefillTokens: 100, Tokens: 160}, t0)
	t2, _ := f.Acquire(a, Claim{PrefillTokens: 50, Tokens: 80}, t0)
	t1.FirstToken(t0)
	if got, want := countsOf(f, 0), (counts{2, 50, 1, 15}); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	t1.Done(t0, NoUsage, nil)
	t2.Done(t0, NoUsage, nil)
	var nilTicket *Ticket
	nilTicket.FirstToken(t0) // must not panic
	nilTicket.Done(t0, NoUsage, nil)
	if _, err := f.Acquire("http://nowhere", Claim{}, t0); !errors.Is(err, ErrUnknownReplica) {
		t.Errorf("Acquire unknown: err %v, want ErrUnknownReplica", err)
	}
}

func TestDecideCommitsAndPins(t *testing.T) {
	f := newFleet(t, Config{Policy: pick(2, 640)})
	var sc Scratch
	req := &Request{ID: "r1", Tokens: 1000, MaxTokens: 100, Session: "conv-1"}
	d, tk := f.Decide(req, nil, t0, &sc)
	if d.Replica != 2 || tk == nil {
		t.Fatalf("decision %+v, ticket %v: want replica 2 and a ticket", d, tk)
	}
	if got, want := tk.Claim(), (Claim{PrefillTokens: 360, Tokens: 1100, PredictedCached: 640, PromptTokens: 1000, HitScale: 1, Output: 100}); got != want {
		t.Errorf("claim %+v, want %+v", got, want)
	}
	if got, _ := f.pin("conv-1", nil, &sc.Snapshot, t0); got != 2 {
		t.Errorf("pin = %d, want 2", got)
	}
	if got, _ := f.pin("other", nil, &sc.Snapshot, t0); got != -1 {
		t.Errorf("pin of unknown session = %d, want -1", got)
	}
	tk.FirstToken(t0)
	tk.Done(t0, Usage{PromptTokens: -1, CachedTokens: 600}, nil)
	v := f.View(t0)
	rv := v.Replicas[2]
	if rv.PredictedCached != 0 || rv.ActualCached != 0 || rv.PromptTokens != 0 || rv.Completed != 1 || rv.Sessions != 1 || v.Sessions != 1 {
		t.Errorf("view %+v (sessions %d), want no totals from a usage without prompt tokens, 1 completed, 1 session", rv, v.Sessions)
	}
	_, tk2 := f.Decide(req, nil, t0, &sc)
	if got := sc.Request.Pinned; got != 2 {
		t.Errorf("second turn: Pinned = %d, want 2", got)
	}
	tk2.Done(t0, Usage{PromptTokens: 2000, CachedTokens: 700}, nil)
	tk2.Done(t0, Usage{PromptTokens: 1, CachedTokens: 1}, nil) // only the first call counts
	// The router estimated 1000 prompt tokens and predicted 640 cached;
	// the engine counted 2000: the prediction is 1280 of the engine's.
	if rv := f.View(t0).Replicas[2]; rv.PromptTokens != 2000 || rv.ActualCached != 700 || rv.PredictedCached != 1280 {
		t.Errorf("after usage (2000, 700): prompt %d, actual %d, predicted %d; want 2000, 700, 1280",
			rv.PromptTokens, rv.ActualCached, rv.PredictedCached)
	}
	reject := newFleet(t, Config{Policy: pick(-1, 0)})
	if d, tk := reject.Decide(req, nil, t0, &sc); tk != nil || d.Replica != -1 {
		t.Errorf("a rejection: decision %+v, ticket %v; want -1 and none", d, tk)
	}
	if got := reject.Sessions(); got != 0 {
		t.Errorf("a rejection bound %d sessions, want 0", got)
	}
}

func TestDecideExcludes(t *testing.T) {
	f := newFleet(t, Config{Policy: route.LeastLoaded{}})
	var sc Scratch
	for i := range 30 {
		d, tk := f.Decide(&Request{ID: fmt.Sprint(i), Hash: uint64(i)}, []int{0, 2}, t0, &sc)
		if d.Replica != 1 {
			t.Fatalf("request %d went to %d with 0 and 2 excluded", i, d.Replica)
		}
		tk.Done(t0, NoUsage, nil)
	}
}

func TestSessions(t *testing.T) {
	f := newFleet(t, Config{Sessions: Sessions{SessionTTL: time.Minute}, Policy: route.LeastLoaded{}})
	var s route.Snapshot
	snap := func(at time.Time) *route.Snapshot { f.Snapshot(&s, at, 0); return &s }
	rb := f.lookup(b)

	f.bind("s1", rb, t0, nil)
	if got, _ := f.pin("s1", nil, snap(t0), t0); got != 1 {
		t.Fatalf("pin = %d, want 1", got)
	}
	// Used again before expiry: stays bound.
	f.bind("s1", rb, t0.Add(50*time.Second), nil)
	if got, _ := f.pin("s1", nil, snap(t0), t0.Add(100*time.Second)); got != 1 {
		t.Errorf("after 50 s idle: pin = %d, want 1", got)
	}
	// Idle beyond the TTL: expired.
	if got, _ := f.pin("s1", nil, snap(t0), t0.Add(161*time.Second)); got != -1 {
		t.Errorf("after 61 s idle: pin = %d, want -1", got)
	}
	if n := f.Sessions(); n != 0 {
		t.Errorf("expired session still stored: %d", n)
	}

	// Replica failure: unpinned, and the next decision re-binds.
	now := t0.Add(200 * time.Second)
	f.bind("s2", rb, now, nil)
	f.SetHealthy(b, false)
	if got, _ := f.pin("s2", nil, snap(now), now); got != -1 {
		t.Errorf("bound replica unhealthy: pin = %d, want -1", got)
	}
	var sc Scratch
	d, tk := f.Decide(&Request{ID: "x", Session: "s2"}, nil, now, &sc)
	tk.Done(t0, NoUsage, nil)
	f.SetHealthy(b, true)
	if got, _ := f.pin("s2", nil, snap(now), now); got != d.Replica || d.Replica == 1 {
		t.Errorf("after re-bind: pin = %d, want %d (not 1)", got, d.Replica)
	}
}

func TestSweepBoundsSessions(t *testing.T) {
	f := newFleet(t, Config{Sessions: Sessions{SessionTTL: time.Minute}})
	ra := f.lookup(a)
	for i := range 1000 {
		f.bind(fmt.Sprint("old-", i), ra, t0, nil)
	}
	f.bind("new", ra, t0.Add(2*time.Minute), nil) // triggers a sweep
	if n := f.Sessions(); n != 1 {
		t.Errorf("after sweep: %d sessions, want 1", n)
	}
}

// windowed is a policy that reads the recent-prefill window.
type windowed struct{ route.Func }

func (windowed) Needs() route.Needs { return route.Needs{Window: 10 * time.Second} }

func TestSnapshotContents(t *testing.T) {
	preset := route.Rates{PrefillPerToken: 50 * time.Microsecond, DecodeStep: 20 * time.Millisecond, MaxSeqs: 128}
	f := newFleet(t, Config{CacheBlocks: 500, Rates: preset, Policy: windowed{pick(0, 0).(route.Func)}})
	f.SetLoad(a, scrape.Load{Running: 4, Waiting: 2, KVUsage: 0.5, BlockSize: 32, NumBlocks: 1000, At: t0})
	f.SetHealthy(c, false)
	t1, _ := f.Acquire(a, Claim{PrefillTokens: 1000, Tokens: 1120}, t0)
	t2, _ := f.Acquire(a, Claim{PrefillTokens: 200, Tokens: 208}, t0.Add(6*time.Second))
	t2.FirstToken(t0.Add(6 * time.Second))

	var s route.Snapshot
	now := t0.Add(7 * time.Second)
	f.Snapshot(&s, now, 16)
	rates := route.Rates{PrefillPerToken: 50 * time.Microsecond, DecodeStep: 20 * time.Millisecond, MaxSeqs: 128, Scale: 1, DecodeScale: 1, HitScale: 1}
	full := preset.WithDefaults()
	work := full.PrefillTime(1000, 0) + full.PrefillTime(200, 0) // both in flight, prefilled or not
	want := route.Snapshot{BlockSize: 16, Replicas: []route.Replica{
		{ID: a, Healthy: true, Running: 4, Waiting: 2, KVUsage: 0.5, Scraped: true, LoadAge: 7 * time.Second,
			InFlight: 2, PrefillTokens: 1000, Decoding: 1, DecodeBlocks: 83, PrefillWork: work, RecentPrefill: 1200,
			CacheBlocks: 2000, Rates: rates},
		{ID: b, Healthy: true, CacheBlocks: 500, Rates: rates},
		{ID: c, Healthy: false, CacheBlocks: 500, Rates: rates},
	}}
	if d := cmp.Diff(want, s); d != "" {
		t.Errorf("snapshot mismatch (-want +got):\n%s", d)
	}

	// The first prefill leaves the 10 s window.
	f.Snapshot(&s, t0.Add(11*time.Second), 16)
	if got := s.Replicas[0].RecentPrefill; got != 200 {
		t.Errorf("RecentPrefill after 11 s = %d, want 200", got)
	}
	t1.Done(t0, NoUsage, nil)
	t2.Done(t0, NoUsage, nil)
	f.Snapshot(&s, now, 16)
	if got := s.Replicas[0].PrefillWork; got != 0 {
		t.Errorf("PrefillWork after both are done = %v, want 0", got)
	}

	allocs := testing.AllocsPerRun(100, func() { f.Snapshot(&s, now, 16) })
	if allocs != 0 {
		t.Errorf("Snapshot into a reused dst: %v allocs, want 0", allocs)
	}
}

func TestAddReplica(t *testing.T) {
	f := newFleet(t, Config{Replicas: reps(a), MaxReplicas: 2})
	if err := f.AddReplica(Replica{ID: b}); err != nil {
		t.Fatal(err)
	}
	if err := f.AddReplica(Replica{ID: a}); err == nil {
		t.Error("duplicate AddReplica: no error")
	}
	if err := f.AddReplica(Replica{ID: c}); err == nil {
		t.Error("AddReplica beyond MaxReplicas: no error")
	}
	if d := cmp.Diff([]string{a, b}, f.Replicas()); d != "" {
		t.Errorf("replicas (-want +got):\n%s", d)
	}
	if _, err := New(Config{Replicas: reps(a, a)}); err == nil {
		t.Error("New with duplicates: no error")
	}
}

func TestIndexKind(t *testing.T) {
	tests := []struct {
		name   string
		needs  route.Needs
		events bool
		want   route.IndexKind
	}{
		{"no index", route.Needs{}, true, route.NoIndex},
		{"generic, no events", route.Needs{Index: route.Approximate}, false, route.Approximate},
		{"generic, events", route.Needs{Index: route.Approximate}, true, route.Precise},
		{"precise, no events", route.Needs{Index: route.Precise}, false, route.Approximate},
		{"precise, events", route.Needs{Index: route.Precise}, true, route.Precise},
		{"own index size", route.Needs{Index: route.Approximate, IndexBlocks: 100}, true, route.Approximate},
		{"own expiry", route.Needs{Index: route.Approximate, IndexTTL: time.Minute}, true, route.Approximate},
	}
	for _, tt := range tests {
		if got := IndexKind(tt.needs, tt.events); got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestConcurrent hammers every method at once; run with -race. All counts
// must return to zero.
func TestConcurrent(t *testing.T) {
	f := newFleet(t, Config{Policy: route.KVAware{}})
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			var sc Scratch
			chains := []residency.Chain{{Tokens: 16, Hashes: []prefix.Hash{1, 2, 3}}}
			for i := range 500 {
				now := t0.Add(time.Duration(i) * time.Millisecond)
				req := &Request{ID: fmt.Sprint(g, "-", i), Hash: uint64(g*1000 + i), Tokens: 100, MaxTokens: 10,
					Session: fmt.Sprint("s", i%20), Chains: chains, TTFT: true}
				_, tk := f.Decide(req, nil, now, &sc)
				if i%3 != 0 {
					tk.FirstToken(now.Add(10 * time.Millisecond))
				}
				f.SetLoad(tk.Replica(), scrape.Load{Running: i, At: now})
				tk.Done(now, Usage{PromptTokens: 100, CachedTokens: i % 50}, nil)
				tk.Done(now, NoUsage, errors.New("again"))
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			f.SetHealthy(b, false)
			f.SetModels(c, []scrape.Model{{ID: "m"}})
			f.SetHealthy(b, true)
			_ = f.View(t0)
		}
	})
	wg.Wait()
	var s route.Snapshot
	f.Snapshot(&s, t0, 0)
	for _, r := range s.Replicas {
		if r.InFlight != 0 || r.PrefillTokens != 0 || r.Decoding != 0 || r.DecodeBlocks != 0 {
			t.Errorf("%s: counts not released: %+v", r.ID, r)
		}
	}
}

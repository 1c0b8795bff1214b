package residency

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvrouter/kvrouter/prefix"
)

// chainOfLen is a chain of n blocks of tokens tokens, hashed from seed.
func chainOfLen(seed uint64, n, tokens int) Chain {
	c := Chain{Tokens: tokens}
	h := prefix.Hash(seed)
	for i := range n {
		h = prefix.Hash(uint64(h)*0x9E3779B97F4A7C15 + uint64(i) + 1)
		c.Hashes = append(c.Hashes, h)
	}
	return c
}

func newTracker(t *testing.T, cfg TrackerConfig, n int) *Tracker {
	t.Helper()
	cfg.MaxReplicas = n
	tr := NewTracker(cfg)
	for r := range n {
		tr.AddReplica(r)
	}
	return tr
}

// match returns the tracker's match of chains for n replicas in unit.
func match(tr *Tracker, chains []Chain, now time.Duration, n int) ([]int, []time.Duration) {
	m, a := make([]int, n), make([]time.Duration, n)
	var sc MatchScratch
	tr.Match(chains, now, tr.Unit(chains), m, a, &sc)
	return m, a
}

func TestTrackerTextMode(t *testing.T) {
	tr := newTracker(t, TrackerConfig{Approximate: true}, 3)
	req := []Chain{chainOfLen(1, 10, 16)}
	var sc MatchScratch
	tr.Match(req, 0, 16, make([]int, 3), nil, &sc)
	tr.Touch(1, req, time.Second, &sc)
	longer := []Chain{{Tokens: 16, Hashes: append(append([]prefix.Hash(nil), req[0].Hashes...), 99, 100)}}
	m, age := match(tr, longer, 3*time.Second, 3)
	if d := cmp.Diff([]int{0, 10, 0}, m); d != "" {
		t.Errorf("match (-want +got):\n%s", d)
	}
	if age[1] != 2*time.Second {
		t.Errorf("age %v, want 2s", age[1])
	}
	// Capacity follows the engine: 4 engine blocks of 32 tokens are 8
	// text blocks of 16.
	tr.SetCapacity(1, 4, 0, 32)
	if held, capacity := tr.Blocks(1); held != 8 || capacity != 8 {
		t.Errorf("after SetCapacity(4 blocks of 32): held %d of %d, want 8 of 8", held, capacity)
	}
	// A CPU tier larger than the GPU: the approximate share holds what the
	// engine can load rather than compute, 6 engine blocks here.
	tr.SetCapacity(1, 4, 6, 32)
	if _, capacity := tr.Blocks(1); capacity != 12 {
		t.Errorf("after SetCapacity(4 GPU and 6 CPU blocks of 32): capacity %d, want 12", capacity)
	}
}

// feed is a Feed whose health the test sets.
type feed struct {
	healthy  map[int]bool
	expected []int
}

func (f *feed) Healthy(r int) bool { return f.healthy[r] }
func (f *feed) Expect(r int)       { f.expected = append(f.expected, r) }

func TestTrackerPrecise(t *testing.T) {
	tr := NewTracker(TrackerConfig{MaxReplicas: 2, Approximate: true, Precise: true, Engine: true})
	fd := &feed{healthy: map[int]bool{0: true}}
	tr.SetFeed(fd)
	for r := range 2 {
		tr.AddReplica(r)
		tr.SetBlockSize(r, 16)
	}
	var changed []int
	tr.Poll(func(r int, live bool) { changed = append(changed, r) })
	if !tr.Live(0) || tr.Live(1) || len(changed) != 1 {
		t.Fatalf("after Poll: live %v %v, changed %v; want replica 0 live only", tr.Live(0), tr.Live(1), changed)
	}
	req := []Chain{chainOfLen(7, 8, 16)}
	tr.Precise().Store(0, req[0].Hashes[:3], 0) // the engine stored 3 blocks
	var sc MatchScratch
	m, a := make([]int, 2), make([]time.Duration, 2)
	tr.Match(req, time.Minute, 16, m, a, &sc)
	if m[0] != 3 || a[0] != 0 {
		t.Errorf("precise match %d at age %v, want 3 at 0", m[0], a[0])
	}
	tr.Touch(0, req, time.Minute, &sc)
	if len(fd.expected) != 1 || fd.expected[0] != 0 {
		t.Errorf("expected events for %v, want [0] (the index lacked 5 of 8 blocks)", fd.expected)
	}
	// The overlay covers the just-routed blocks until its TTL.
	tr.Match(req, time.Minute+time.Second, 16, m, a, &sc)
	if m[0] != 8 {
		t.Errorf("with the overlay: match %d, want 8", m[0])
	}
	tr.Match(req, time.Minute+DefaultOverlayTTL+time.Second, 16, m, a, &sc)
	if m[0] != 3 {
		t.Errorf("after the overlay's TTL: match %d, want 3", m[0])
	}
	// Replica 1's stream is not trusted: it is matched approximately.
	tr.Touch(1, req, time.Minute, &sc)
	tr.Match(req, 2*time.Minute, 16, m, a, &sc)
	if m[1] != 8 || a[1] != time.Minute {
		t.Errorf("fallback match %d at age %v, want 8 at 1m", m[1], a[1])
	}
}

// TestTrackerEvictedInPreciseMode: in precise mode, without a feed (every
// stream trusted, as in the simulator) too, the router's decisions keep
// the approximate index, so a replica whose engine removed blocks it was
// sent shows them as evicted; one that holds all it was sent, or was sent
// nothing, does not. Those removed while the overlay still covers them
// count once it lapses.
func TestTrackerEvictedInPreciseMode(t *testing.T) {
	tr := NewTracker(TrackerConfig{MaxReplicas: 3, Approximate: true, Precise: true, Engine: true})
	for r := range 3 {
		tr.AddReplica(r)
		tr.SetBlockSize(r, 16)
	}
	req := []Chain{chainOfLen(3, 10, 16)}
	var sc MatchScratch
	m := make([]int, 3)
	for _, r := range []int{0, 1} { // both were sent the whole prompt and stored it
		tr.Match(req, 0, 16, m, nil, &sc)
		tr.Touch(r, req, 0, &sc)
		tr.Precise().Store(r, req[0].Hashes, 0)
	}
	tr.Precise().Remove(0, req[0].Hashes[4:]) // 0 evicted its last 6 blocks
	later := time.Minute
	tr.Match(req, later, 16, m, nil, &sc)
	if d := cmp.Diff([]int{4, 10, 0}, m); d != "" {
		t.Errorf("precise match (-want +got):\n%s", d)
	}
	if sent, r := sc.Evicted(m); sent != 10 || r != 0 {
		t.Errorf("Evicted = %d blocks sent to replica %d, want 10 to 0", sent, r)
	}
	tr.Precise().Store(0, req[0].Hashes[4:], later) // computed again
	tr.Match(req, later, 16, m, nil, &sc)
	if sent, r := sc.Evicted(m); r != -1 {
		t.Errorf("with every block held again: Evicted = %d on %d, want none (-1)", sent, r)
	}
	// Sent, then removed before the overlay's TTL: evicted once it lapses.
	tr.Touch(2, req, later, &sc)
	tr.Precise().Store(2, req[0].Hashes, later)
	tr.Precise().Remove(2, req[0].Hashes)
	tr.Match(req, later+time.Second, 16, m, nil, &sc)
	if _, r := sc.Evicted(m); r != -1 {
		t.Errorf("under the overlay: Evicted on %d, want none", r)
	}
	tr.Match(req, later+DefaultOverlayTTL+time.Second, 16, m, nil, &sc)
	if sent, r := sc.Evicted(m); sent != 10 || r != 2 {
		t.Errorf("after the overlay: Evicted = %d on %d, want 10 on 2", sent, r)
	}
}

// TestTrackerBlockSizes: in token mode each replica is matched at its own
// engine block size, counted in the smallest chain's blocks, and not at
// all before its block size is known.
func TestTrackerBlockSizes(t *testing.T) {
	tr := newTracker(t, TrackerConfig{Approximate: true, Engine: true}, 3)
	tr.SetBlockSize(0, 16)
	tr.SetBlockSize(1, 32)
	req := []Chain{chainOfLen(1, 20, 16), chainOfLen(2, 10, 32)}
	var sc MatchScratch
	tr.Match(req, 0, 16, make([]int, 3), nil, &sc)
	for r := range 3 {
		tr.Touch(r, req, 0, &sc)
	}
	m, _ := match(tr, req, time.Second, 3)
	if d := cmp.Diff([]int{20, 20, 0}, m); d != "" {
		t.Errorf("match in 16-token blocks (-want +got):\n%s", d)
	}
	if held, _ := tr.Blocks(2); held != 0 {
		t.Errorf("replica of unknown block size holds %d blocks, want 0", held)
	}
	if u := tr.Unit(req[1:]); u != 32 {
		t.Errorf("unit of a fleet of 32-token blocks: %d, want 32", u)
	}
}

func TestTrackerCoarse(t *testing.T) {
	tr := newTracker(t, TrackerConfig{Approximate: true, CoarseTokens: 64}, 2)
	req := []Chain{chainOfLen(1, 10, 16)}
	var sc MatchScratch
	tr.Match(req, 0, 64, make([]int, 2), nil, &sc)
	tr.Touch(0, req, 0, &sc)
	if held, _ := tr.Blocks(0); held != 2 {
		t.Errorf("10 blocks of 16 touched: %d index blocks of 64, want 2", held)
	}
	m, _ := match(tr, req, 0, 2)
	if m[0] != 2 || tr.Unit(req) != 64 {
		t.Errorf("match %d in unit %d, want 2 in 64", m[0], tr.Unit(req))
	}
}

func TestTrackerBlockSizesList(t *testing.T) {
	tr := newTracker(t, TrackerConfig{Approximate: true, Engine: true}, 3)
	if got := tr.BlockSizes(); len(got) != 0 {
		t.Errorf("no size known: got %v", got)
	}
	tr.SetBlockSize(2, 32)
	tr.SetBlockSize(0, 16)
	tr.SetBlockSize(1, 32)
	if got := tr.BlockSizes(); !slices.Equal(got, []int{16, 32}) {
		t.Errorf("got %v, want [16 32]", got)
	}
	tr.SetBlockSize(2, 16)
	tr.SetBlockSize(1, 16)
	if got := tr.BlockSizes(); !slices.Equal(got, []int{16}) {
		t.Errorf("after the 32s changed: got %v, want [16]", got)
	}
}

package residency

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/kvrouter/kvrouter/prefix"
)

// An index event for TestHoldRelease: a Hold, Release or Touch of a chain
// on replica r at at.
type holdEvent struct {
	kind   string // "hold", "release" or "touch"
	r      int
	hashes []prefix.Hash
	at     time.Duration
}

// TestHoldRelease: a held block's age reads at most zero until the last
// request holding it is released, and from its release on it ages; the
// blocks it shares with a request still held stay held.
func TestHoldRelease(t *testing.T) {
	ctx, q1, q2 := chain(0, 4), append(chain(0, 4), 10, 11), append(chain(0, 4), 20, 21)
	tests := []struct {
		name      string
		cfg       Config
		events    []holdEvent
		query     []prefix.Hash
		now       time.Duration
		wantMatch []int
		wantAge   []time.Duration // ≤ 0 read as 0
	}{
		{"held: age zero however long ago it was sent", Config{MaxReplicas: 2},
			[]holdEvent{{"hold", 0, q1, 10}, {"touch", 1, q1, 10}},
			q1, 100, []int{6, 6}, []time.Duration{0, 90}},
		{"released: ages from the release, not the send", Config{MaxReplicas: 1},
			[]holdEvent{{"hold", 0, q1, 10}, {"release", 0, q1, 80}},
			q1, 100, []int{6}, []time.Duration{20}},
		{"a shared context stays held while another request holds it", Config{MaxReplicas: 1},
			[]holdEvent{{"hold", 0, q1, 10}, {"hold", 0, q2, 20}, {"release", 0, q1, 30}},
			ctx, 100, []int{4}, []time.Duration{0}},
		{"the released request's own blocks age beside the held context", Config{MaxReplicas: 1},
			[]holdEvent{{"hold", 0, q1, 10}, {"hold", 0, q2, 20}, {"release", 0, q1, 30}},
			q1, 100, []int{6}, []time.Duration{70}},
		{"both released: the context ages from the later release", Config{MaxReplicas: 1},
			[]holdEvent{{"hold", 0, q1, 10}, {"hold", 0, q2, 20}, {"release", 0, q2, 40}, {"release", 0, q1, 60}},
			ctx, 100, []int{4}, []time.Duration{40}},
		{"a touch of a held block keeps it held", Config{MaxReplicas: 1},
			[]holdEvent{{"hold", 0, q1, 10}, {"touch", 0, ctx, 50}},
			q1, 100, []int{6}, []time.Duration{0}},
		{"a held block does not expire", Config{MaxReplicas: 2, TTL: 30},
			[]holdEvent{{"hold", 0, q1, 10}, {"touch", 1, q1, 10}},
			q1, 100, []int{6, 0}, []time.Duration{0, 0}},
		{"a release of what was never held stamps it", Config{MaxReplicas: 1},
			[]holdEvent{{"touch", 0, q1, 10}, {"release", 0, q1, 50}},
			q1, 100, []int{6}, []time.Duration{50}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x := New(tc.cfg)
			for _, ev := range tc.events {
				switch ev.kind {
				case "hold":
					x.Hold(ev.r, ev.hashes, ev.at)
				case "release":
					x.Release(ev.r, ev.hashes, ev.at)
				case "touch":
					x.Touch(ev.r, ev.hashes, ev.at)
				}
			}
			match := make([]int, len(tc.wantMatch))
			age := make([]time.Duration, len(tc.wantMatch))
			x.Match(tc.query, tc.now, match, age)
			for r := range age {
				age[r] = max(age[r], 0)
			}
			if diff := cmp.Diff(tc.wantMatch, match); diff != "" {
				t.Errorf("match (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantAge, age); diff != "" {
				t.Errorf("age (-want +got):\n%s", diff)
			}
		})
	}
}

// TestHoldHot: a block held by enough replicas to get a bitset keeps its
// holders' stamps there: the held ones read age 0, the released one its
// release's age, the merely touched ones their touch's.
func TestHoldHot(t *testing.T) {
	const n = 2 * hotAt
	x := New(Config{MaxReplicas: n})
	c := chain(0, 8)
	for r := range n {
		if r%2 == 0 {
			x.Hold(r, c, time.Duration(r))
		} else {
			x.Touch(r, c, time.Duration(r))
		}
	}
	if len(x.hots) == 0 {
		t.Fatal("no block became hot")
	}
	x.Release(0, c, 50)
	match := make([]int, n)
	age := make([]time.Duration, n)
	x.Match(c, 100, match, age)
	for r := range n {
		want := 100 - time.Duration(r) // touched
		switch {
		case r == 0:
			want = 50
		case r%2 == 0:
			want = 0
		}
		if match[r] != 8 || max(age[r], 0) != want {
			t.Errorf("replica %d: match %d age %v, want 8 %v", r, match[r], max(age[r], 0), want)
		}
	}
}

// TestTrackerHold: the tracker's Match and Fresh read a held match at age
// zero (never negative), and a released one from its release; in precise
// mode the approximate share is held too: a replica whose stream is not
// trusted falls back to it.
func TestTrackerHold(t *testing.T) {
	for _, cfg := range []TrackerConfig{{Approximate: true}, {Approximate: true, Precise: true}} {
		tr := newTracker(t, cfg, 2)
		if cfg.Precise {
			tr.SetFeed(&feed{}) // no stream healthy
		}
		req := []Chain{chainOfLen(1, 10, 16)}
		var sc MatchScratch
		tr.Match(req, 0, 16, make([]int, 2), nil, &sc)
		tr.Hold(1, req, time.Second, &sc)
		m, age := match(tr, req, 9*time.Second, 2)
		if d := cmp.Diff([]int{0, 10}, m); d != "" {
			t.Errorf("precise %v: held match (-want +got):\n%s", cfg.Precise, d)
		}
		if d := cmp.Diff([]time.Duration{0, 0}, age); d != "" {
			t.Errorf("precise %v: held age (-want +got):\n%s", cfg.Precise, d)
		}
		if n, a := tr.Fresh(req, 16, 1, 10, time.Second, 9*time.Second, &sc); n != 10 || a != 0 {
			t.Errorf("precise %v: held Fresh %d at %v, want 10 at 0s", cfg.Precise, n, a)
		}
		tr.Release(1, req, 5*time.Second, &sc)
		if _, age = match(tr, req, 9*time.Second, 2); age[1] != 4*time.Second {
			t.Errorf("precise %v: released age %v, want 4s", cfg.Precise, age[1])
		}
	}
}

package poll

import (
	"context"
	"errors"
	"hash/fnv"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// recorder records when each target's loop ran, relative to start.
type recorder struct {
	start time.Time
	mu    sync.Mutex
	runs  map[string][]time.Duration
}

func newRecorder() *recorder {
	return &recorder{start: time.Now(), runs: map[string][]time.Duration{}}
}

func (r *recorder) do(ctx context.Context, id string, _ int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs[id] = append(r.runs[id], time.Since(r.start))
}

func (r *recorder) get(id string) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.runs[id])
}

// TestEveryTiming checks the offset, the fixed period and what a slow or
// overrunning run does to the next start, on a fake clock.
func TestEveryTiming(t *testing.T) {
	const period = 100 * time.Millisecond
	tests := []struct {
		name string
		work time.Duration // how long each run takes
		want func(off time.Duration) []time.Duration
	}{
		{"instant", 0, func(o time.Duration) []time.Duration {
			return []time.Duration{o, o + period, o + 2*period, o + 3*period}
		}},
		{"slow run keeps the period", 30 * time.Millisecond, func(o time.Duration) []time.Duration {
			return []time.Duration{o, o + period, o + 2*period, o + 3*period}
		}},
		{"overrun starts the next at once", 250 * time.Millisecond, func(o time.Duration) []time.Duration {
			return []time.Duration{o, o + 250*time.Millisecond, o + 500*time.Millisecond, o + 750*time.Millisecond}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const id = "http://replica:8000"
				var starts []time.Duration
				begin := time.Now()
				ctx, cancel := context.WithCancel(t.Context())
				every(ctx, Offset(id, period), period, func(ctx context.Context) {
					starts = append(starts, time.Since(begin))
					if len(starts) == 4 {
						cancel()
					}
					time.Sleep(tt.work) // synctest: advances the bubble's clock
				}, nil)
				if want := tt.want(Offset(id, period)); !slices.Equal(starts, want) {
					t.Errorf("got starts %v, want %v", starts, want)
				}
			})
		})
	}
}

// TestEverySkip: a run's Skip leaves periods out, and its wake channel
// brings the next run to the start of the next period, on a fake clock.
func TestEverySkip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const period = 100 * time.Millisecond
		begin := time.Now()
		var starts []time.Duration
		wake := make(chan struct{})
		skips := []int{0, 2, 3, 0}
		ctx, cancel := context.WithCancel(t.Context())
		go func() {
			time.Sleep(450 * time.Millisecond) // synctest: the wake falls inside the 3 periods left out after the run at 300 ms
			close(wake)
		}()
		every(ctx, 0, period, func(context.Context) {
			starts = append(starts, time.Since(begin))
			if len(starts) == len(skips)+1 {
				cancel()
			}
		}, func() (int, <-chan struct{}) {
			return skips[len(starts)-1], wake
		})
		// Runs at 0; skip 0: 100; skip 2: 400; skip 3 (due at 800), woken
		// at 450: 500; skip 0: 600.
		want := []time.Duration{0, 100 * time.Millisecond, 400 * time.Millisecond, 500 * time.Millisecond, 600 * time.Millisecond}
		if !slices.Equal(starts, want) {
			t.Errorf("got starts %v, want %v", starts, want)
		}
	})
}

// TestImmediate: an Immediate loop's first run is at once, the next a
// period later.
func TestImmediate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const period = time.Second
		r := newRecorder()
		var g Group[int]
		g.Add("a", 1)
		ctx, cancel := context.WithCancel(t.Context())
		ran := make(chan error, 1)
		go func() { ran <- g.Run(ctx, Loop[int]{Period: period, Immediate: true, Do: r.do}) }()
		time.Sleep(period + time.Millisecond) // synctest: advances the bubble's clock
		synctest.Wait()
		if got := r.get("a"); len(got) != 2 || got[0] != 0 || got[1] != period {
			t.Errorf("got runs at %v, want [0s 1s]", got)
		}
		cancel()
		<-ran
	})
}

// TestGroup checks Add before and during Run, Remove, and that Run joins
// every loop before it returns, on a fake clock.
func TestGroup(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const period = time.Second
		r := newRecorder()
		var g Group[int] // the zero value is ready
		if !g.Add("a", 1) || g.Add("a", 2) {
			t.Fatal("Add: got a second add of the same id, want only the first")
		}
		if v, ok := g.Get("a"); !ok || v != 1 {
			t.Fatalf("Get(a): got %v %v, want 1 true", v, ok)
		}
		ctx, cancel := context.WithCancel(t.Context())
		ran := make(chan error, 1)
		go func() { ran <- g.Run(ctx, Loop[int]{Period: period, Do: r.do}) }()

		time.Sleep(period - time.Nanosecond) // synctest: advances the bubble's clock
		synctest.Wait()
		if got := len(r.get("a")); got != 1 {
			t.Fatalf("a after one period: got %d runs, want 1", got)
		}
		if err := g.Run(ctx, Loop[int]{Period: period, Do: r.do}); !errors.Is(err, ErrRunning) {
			t.Errorf("second Run: got %v, want ErrRunning", err)
		}

		added := time.Since(r.start)
		g.Add("b", 2)
		time.Sleep(3 * period) // synctest: advances the bubble's clock
		synctest.Wait()
		if got, want := r.get("b"), added+Offset("b", period); len(got) != 3 || got[0] != want {
			t.Errorf("b added during Run: got runs %v, want 3 from %v", got, want)
		}

		if v, ok := g.Remove("a"); !ok || v != 1 {
			t.Errorf("Remove(a): got %v %v, want 1 true", v, ok)
		}
		if _, ok := g.Remove("a"); ok {
			t.Error("second Remove(a): got true, want false")
		}
		n := len(r.get("a"))
		time.Sleep(3 * period) // synctest: advances the bubble's clock
		synctest.Wait()
		if got := len(r.get("a")); got != n {
			t.Errorf("removed a: got %d more runs, want 0", got-n)
		}

		cancel()
		if err := <-ran; !errors.Is(err, context.Canceled) {
			t.Errorf("Run: got %v, want context.Canceled", err)
		}
		n = len(r.get("b"))
		time.Sleep(3 * period) // synctest: advances the bubble's clock
		if got := len(r.get("b")); got != n {
			t.Errorf("after Run returned: got %d more runs, want 0", got-n)
		}
	})
}

// TestGroupRunJoins checks that Run waits for a run in progress, that
// loops see their context done, and that the group runs again afterwards.
func TestGroupRunJoins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var g Group[string]
		g.Add("x", "v")
		release := make(chan struct{})
		var stopped, v2 bool
		slow := Loop[string]{Period: time.Hour, Do: func(ctx context.Context, id, v string) {
			<-ctx.Done()
			<-release // a run that outlives its context
			stopped = true
		}}
		ctx, cancel := context.WithCancel(t.Context())
		ran := make(chan error, 1)
		go func() { ran <- g.Run(ctx, slow) }()
		time.Sleep(time.Hour) // synctest: advances the bubble's clock
		cancel()
		synctest.Wait()
		select {
		case err := <-ran:
			t.Fatalf("Run returned %v before its loop did", err)
		default:
		}
		close(release)
		<-ran
		if !stopped {
			t.Error("Run returned before the run in progress finished")
		}

		ctx, cancel = context.WithCancel(t.Context())
		defer cancel()
		go func() {
			ran <- g.Run(ctx, Loop[string]{Period: time.Minute, Do: func(ctx context.Context, id, v string) {
				v2 = id == "x" && v == "v"
				cancel()
			}})
		}()
		if err := <-ran; !errors.Is(err, context.Canceled) {
			t.Errorf("second Run: got %v, want context.Canceled", err)
		}
		if !v2 {
			t.Error("second Run: got no run of x, want one")
		}
	})
}

func TestRunBadLoop(t *testing.T) {
	var g Group[int]
	for _, l := range []Loop[int]{{Period: 0, Do: func(context.Context, string, int) {}}, {Period: time.Second}} {
		if err := g.Run(t.Context(), l); err == nil {
			t.Errorf("Run(%+v): got nil error, want one", l)
		}
	}
}

func TestOffset(t *testing.T) {
	tests := []struct {
		key    string
		period time.Duration
	}{
		{"http://a:1", 100 * time.Millisecond},
		{"http://a:2", 100 * time.Millisecond},
		{"http://b:1", time.Second},
		{"", time.Second},
		{"x", 1},
	}
	for _, tt := range tests {
		h := fnv.New64a()
		h.Write([]byte(tt.key))
		want := time.Duration(h.Sum64() % uint64(tt.period))
		if got := Offset(tt.key, tt.period); got != want || got < 0 || got >= tt.period {
			t.Errorf("Offset(%q, %v): got %v, want %v", tt.key, tt.period, got, want)
		}
	}
	for _, p := range []time.Duration{0, -time.Second} {
		if got := Offset("x", p); got != 0 {
			t.Errorf("Offset(x, %v): got %v, want 0", p, got)
		}
	}
}

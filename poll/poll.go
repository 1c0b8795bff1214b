// Package poll runs periodic loops for a changing set of targets: one
// goroutine per target and loop, each firing at a fixed period from an
// offset hashed from the target's id, so that the loops of many targets
// spread over the period instead of firing together. The health checker
// and the metrics scraper are built on it.
//
// The loops follow Prometheus' scrape loop (one loop per target, a hashed
// offset, a fixed period that a slow run does not shift).
package poll

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"
)

// ErrRunning is returned by Group.Run when the group is already running.
var ErrRunning = errors.New("poll: already running")

// Loop is one periodic job run for every target of a Group.
type Loop[T any] struct {
	// Period is the time between the starts of two runs; it must be
	// positive. A run that takes longer than Period delays the next one by
	// its overrun only; runs of one loop never overlap.
	Period time.Duration
	// Immediate makes the first run start when the loop does, instead of
	// at the target's hashed offset: for a first reading wanted at once
	// (later runs keep the period from it).
	Immediate bool
	// Do runs once for target id, whose value is v; ctx is done when the
	// target is removed or the group stops. It is called from the loop's
	// own goroutine, so calls for one target and loop are ordered.
	Do func(ctx context.Context, id string, v T)
	// Skip, if set, is asked after each run of Do how many periods to
	// leave out before the next run, and for a channel whose closing ends
	// that wait at the next period's start: a loop that backs off while
	// its target is idle, waking no goroutine meanwhile. Zero periods, or
	// nil, means the next period, as without Skip. It is called from the
	// loop's own goroutine.
	Skip func(id string, v T) (periods int, wake <-chan struct{})
}

// Group is a set of targets, each an id with a value of type T, that runs
// its loops for every target while Run runs. Add and Remove may be called
// at any time, before or during Run. The zero value is an empty group,
// ready to use; a Group must not be copied after first use.
type Group[T any] struct {
	// mu guards targets, ctx, loops and running.
	mu      sync.Mutex
	targets map[string]*entry[T]
	ctx     context.Context // Run's context while loops may start, else nil
	loops   []Loop[T]       // Run's loops, while ctx is set
	running bool            // from Run's start until its loops are joined
	wg      sync.WaitGroup  // joins the loops
}

// entry is one target and the cancellation of its loops.
type entry[T any] struct {
	v      T
	cancel context.CancelFunc // nil while its loops do not run
}

// Add adds target id with value v and, during Run, starts its loops. It
// reports whether id was added: false, and v is dropped, if id is present.
func (g *Group[T]) Add(id string, v T) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.targets[id]; ok {
		return false
	}
	if g.targets == nil {
		g.targets = make(map[string]*entry[T])
	}
	e := &entry[T]{v: v}
	g.targets[id] = e
	if g.ctx != nil {
		g.startLocked(id, e)
	}
	return true
}

// Remove removes target id and cancels its loops' context, without waiting
// for a run in progress to return. It returns id's value and whether id was
// present.
func (g *Group[T]) Remove(id string) (T, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e, ok := g.targets[id]
	if !ok {
		var zero T
		return zero, false
	}
	delete(g.targets, id)
	if e.cancel != nil {
		e.cancel()
	}
	return e.v, true
}

// Get returns target id's value and whether id is present.
func (g *Group[T]) Get(id string) (T, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e, ok := g.targets[id]
	if !ok {
		var zero T
		return zero, false
	}
	return e.v, true
}

// Values returns every target's value, in no particular order.
func (g *Group[T]) Values() []T {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]T, 0, len(g.targets))
	for _, e := range g.targets {
		out = append(out, e.v)
	}
	return out
}

// Run runs loops for every target, and for every target added meanwhile,
// until ctx is done; then it waits for all the loops to return and returns
// ctx's error. It returns ErrRunning at once if the group is already
// running, and an error if a loop has no positive Period or no Do. The
// group may run again after Run returns.
func (g *Group[T]) Run(ctx context.Context, loops ...Loop[T]) error {
	for i, l := range loops {
		if l.Period <= 0 || l.Do == nil {
			return fmt.Errorf("poll: loop %d: period %v, Do set %v: want a positive period and a Do", i, l.Period, l.Do != nil)
		}
	}
	g.mu.Lock()
	if g.running {
		g.mu.Unlock()
		return ErrRunning
	}
	g.running, g.ctx, g.loops = true, ctx, loops
	for id, e := range g.targets {
		g.startLocked(id, e)
	}
	g.mu.Unlock()

	<-ctx.Done()
	g.mu.Lock()
	g.ctx, g.loops = nil, nil
	for _, e := range g.targets {
		e.cancel()
		e.cancel = nil
	}
	g.mu.Unlock()
	g.wg.Wait()
	g.mu.Lock()
	g.running = false
	g.mu.Unlock()
	return ctx.Err()
}

// startLocked starts e's loops under Run's context; g.mu is held.
func (g *Group[T]) startLocked(id string, e *entry[T]) {
	ctx, cancel := context.WithCancel(g.ctx)
	e.cancel = cancel
	for _, l := range g.loops {
		g.wg.Go(func() {
			first := Offset(id, l.Period)
			if l.Immediate {
				first = 0
			}
			var skip func() (int, <-chan struct{})
			if l.Skip != nil {
				skip = func() (int, <-chan struct{}) { return l.Skip(id, e.v) }
			}
			every(ctx, first, l.Period, func(ctx context.Context) { l.Do(ctx, id, e.v) }, skip)
		})
	}
}

// every calls do first after first, then every period, until ctx is done.
// The period is fixed: a slow call delays the next one only by what it
// overran. skip, if not nil, is asked after each call for the periods to
// leave out before the next (Loop.Skip) and a channel whose closing moves
// the next call to the start of the next period.
func every(ctx context.Context, first, period time.Duration, do func(context.Context), skip func() (int, <-chan struct{})) {
	timer := time.NewTimer(first)
	defer timer.Stop()
	var (
		start time.Time
		due   time.Duration   // the next call's time after start
		wake  <-chan struct{} // nil (never ready) but while periods are left out
	)
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
			wake = nil
			if el := time.Since(start); el < due {
				timer.Reset(period - el%period)
				continue
			}
		case <-timer.C:
		}
		wake = nil
		start = time.Now()
		do(ctx)
		if ctx.Err() != nil {
			return
		}
		n := 0
		if skip != nil {
			if n, wake = skip(); n <= 0 {
				n, wake = 0, nil
			}
		}
		due = time.Duration(n+1) * period
		timer.Reset(max(due-time.Since(start), 0))
	}
}

// Offset is the delay before a target's first run: FNV-1a of key reduced
// modulo period, in [0, period); zero if period is not positive.
func Offset(key string, period time.Duration) time.Duration {
	if period <= 0 {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(key))
	return time.Duration(h.Sum64() % uint64(period))
}

package emulator

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/prefix"
)

// errStopped is what requests in flight get when the engine loop ends.
var errStopped = errors.New("engine stopped")

// errReset is what requests in flight get when Reset drops the engine.
var errReset = errors.New("engine reset")

// maxCatchUp bounds how many engine iterations one wake-up runs when the
// loop has fallen behind the wall clock.
const maxCatchUp = 256

// flight is one request as its HTTP handler follows it. The engine
// goroutine writes it; the handler reads it after a notify.
type flight struct {
	req    engine.Request
	added  chan error    // receives Add's result once
	notify chan struct{} // capacity 1: "something changed"

	mu     sync.Mutex // guards tokens, done, final and err
	tokens int        // output tokens so far
	done   bool
	final  engine.Event // the Done event
	err    error        // set when the engine stopped or reset

	lastToken time.Duration // engine goroutine only: for inter-token latency
	// remoteAt is when the source of a KV import (req.RemoteBlocks)
	// answered; req.RemoteSent is a delay from it until the engine loop
	// adds the request (importBlocks, remoteSent).
	remoteAt time.Time
}

func newFlight(req engine.Request) *flight {
	return &flight{req: req, added: make(chan error, 1), notify: make(chan struct{}, 1)}
}

// state returns a consistent view of the flight.
func (f *flight) state() (tokens int, done bool, final engine.Event, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tokens, f.done, f.final, f.err
}

func (f *flight) update(fn func(f *flight)) {
	f.mu.Lock()
	fn(f)
	f.mu.Unlock()
	select {
	case f.notify <- struct{}{}:
	default:
	}
}

// Run drives the engine on the wall clock until ctx ends: engine time is
// wall time since Run started divided by TimeScale. It then fails the
// requests in flight, closes the ZMQ sockets and returns nil. Run may be
// called once.
func (s *Server) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("emulator: Run called twice")
	}
	defer s.closePublisher()
	defer close(s.stopped)
	l := loop{s: s, start: time.Now(), flights: map[string]*flight{}, next: engine.Idle}
	if s.cfg.KVFullStatus != 0 {
		l.cached = map[prefix.Hash]struct{}{}
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case f := <-s.submit:
			l.add(f)
		case id := <-s.cancels:
			l.cancel(id)
		case ack := <-s.resets:
			l.reset()
			close(ack)
		case o := <-s.reads:
			l.read(o)
		case <-timer.C:
		case <-ctx.Done():
			l.failAll(errStopped)
			return nil
		}
		timer.Reset(l.step())
	}
}

// loop is the engine goroutine's state.
type loop struct {
	s       *Server
	start   time.Time
	flights map[string]*flight
	keep    []engine.Event // block events not yet published (step publishes them)
	// cached is the engine's cached blocks as its events report them,
	// for admissible; nil unless Config.KVFullStatus is set.
	cached map[prefix.Hash]struct{}
	// t is the engine time of the last call into the engine, next the
	// wake-up the last Step asked for.
	t, next time.Duration
}

// now is the engine clock: wall time since start over the time scale.
func (l *loop) now() time.Duration {
	return time.Duration(float64(time.Since(l.start)) / l.s.scale)
}

func (l *loop) add(f *flight) {
	// Run the iterations that were due before the request came (the loop
	// may wake late on a busy host), so that it joins the engine at the
	// right point of its schedule and the late wake-up does not delay
	// the requests already running.
	l.catchUp(l.now())
	l.t = max(l.t, l.now())
	l.remoteSent(f)
	if err := l.admissible(&f.req); err != nil {
		f.added <- err
		return
	}
	if err := l.s.eng.Add(l.t, &f.req); err != nil {
		f.added <- err
		return
	}
	l.flights[f.req.ID] = f
	f.added <- nil
}

func (l *loop) cancel(id string) {
	if _, ok := l.flights[id]; !ok {
		return
	}
	delete(l.flights, id)
	l.t = max(l.t, l.now())
	l.s.eng.Cancel(l.t, id)
}

// reset replaces the engine by a fresh one, as a restart would.
func (l *loop) reset() {
	eng, err := engine.New(l.s.ecfg)
	if err != nil { // cannot happen: the same config built the first one
		l.s.log.Error("emulator reset", "err", err)
		return
	}
	l.failAll(errReset)
	l.keep = l.keep[:0] // the old engine's events, which AllCleared drops
	l.s.eng = eng
	clear(l.cached)
	l.next = engine.Idle
	l.publish([]engine.Event{{Kind: engine.AllCleared, At: l.now()}})
	st := eng.Stats()
	l.s.stats.Store(&st)
}

func (l *loop) failAll(err error) {
	for id, f := range l.flights {
		f.update(func(f *flight) { f.err = err })
		delete(l.flights, id)
	}
}

// step runs the engine up to now, delivers its events and returns how long
// to sleep (wall time) until the next call. When the loop wakes late, each
// iteration still starts exactly when the previous one ended (at most
// maxCatchUp of them per wake-up), so timer slack does not slow the model.
func (l *loop) step() time.Duration {
	target := l.now()
	for range maxCatchUp {
		at := target
		if l.next <= target {
			at = max(l.next, l.t)
		}
		out, next := l.s.eng.Step(at)
		l.t, l.next = at, next
		l.deliver(out)
		if next > target {
			break
		}
	}
	l.publish(l.keep)
	l.keep = l.keep[:0]
	st := l.s.eng.Stats()
	l.s.stats.Store(&st)
	if l.next == engine.Idle {
		return time.Hour
	}
	// Round up (and add 1 ns) so the loop never wakes just before next
	// and spins: at the next wake-up now() >= next.
	return max(time.Duration(math.Ceil(float64(l.next-l.now())*l.s.scale))+1, 0)
}

// catchUp runs the iterations due by target, each when the previous one
// ended (at most maxCatchUp), without starting one early.
func (l *loop) catchUp(target time.Duration) {
	for range maxCatchUp {
		if l.next > target || l.next == engine.Idle {
			return
		}
		at := max(l.next, l.t)
		out, next := l.s.eng.Step(at)
		l.t, l.next = at, next
		l.deliver(out)
	}
}

func (l *loop) deliver(events []engine.Event) {
	for i := range events {
		ev := &events[i]
		switch ev.Kind {
		case engine.FirstToken:
			l.firstToken(ev)
		case engine.Token:
			l.token(ev)
		case engine.Done:
			l.done(ev)
		case engine.BlockStored, engine.BlockRemoved, engine.AllCleared:
			l.track(ev)
			if l.s.pub != nil {
				k := *ev
				k.Hashes = append([]prefix.Hash(nil), ev.Hashes...)
				k.TokenIDs = append([]uint32(nil), ev.TokenIDs...)
				l.keep = append(l.keep, k)
			}
		}
	}
}

func (l *loop) firstToken(ev *engine.Event) {
	f := l.flights[ev.Req]
	if f == nil {
		return
	}
	f.lastToken = ev.At
	f.update(func(f *flight) { f.tokens = max(f.tokens, 1) })
}

func (l *loop) token(ev *engine.Event) {
	f := l.flights[ev.Req]
	if f == nil {
		return
	}
	l.s.m.itl.Observe((ev.At - f.lastToken).Seconds())
	f.lastToken = ev.At
	f.update(func(f *flight) { f.tokens++ })
}

func (l *loop) done(ev *engine.Event) {
	f := l.flights[ev.Req]
	if f == nil {
		return
	}
	delete(l.flights, ev.Req)
	l.s.m.observeDone(ev)
	final := *ev
	final.Hashes, final.TokenIDs = nil, nil
	f.update(func(f *flight) {
		f.done = true
		f.final = final
		f.tokens = max(f.tokens, final.OutputTokens)
	})
}

// publish sends the block events as one batch, stamped with the wall clock
// (unix seconds, as vLLM's time.time()).
func (l *loop) publish(events []engine.Event) {
	if l.s.pub == nil || len(events) == 0 {
		return
	}
	now := time.Now()
	ts := float64(now.UnixNano()) / 1e9
	if payload := l.s.enc.encode(ts, events); payload != nil {
		l.s.pub.publish(payload)
	}
}

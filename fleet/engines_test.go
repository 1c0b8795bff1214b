package fleet

import (
	"math"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/scrape"
)

// engineRun drives a fleet of engine models on one virtual clock as the
// simulator does: arrivals the test routes through the fleet, engine
// steps, and a scrape of every engine each scrapeEvery.
type engineRun struct {
	t           *testing.T
	f           *Fleet
	ids         []string
	engines     []*engine.Engine
	scrapeEvery time.Duration
	// onDone, if set, sees each completed request with its ticket, after
	// its Done.
	onDone func(ev engine.Event, tk *Ticket)

	now        time.Duration
	nextScrape time.Duration
	wake       []time.Duration // next engine step; -1 idle
	tickets    map[string]*Ticket
	done       int // requests completed
}

func newEngineRun(t *testing.T, f *Fleet, ids []string, engines []*engine.Engine, scrapeEvery time.Duration) *engineRun {
	r := &engineRun{t: t, f: f, ids: ids, engines: engines, scrapeEvery: scrapeEvery,
		wake: make([]time.Duration, len(engines)), tickets: map[string]*Ticket{}}
	for i := range r.wake {
		r.wake[i] = -1
	}
	return r
}

// at is d on the fleet's clock.
func (r *engineRun) at(d time.Duration) time.Time { return t0.Add(d) }

// advance moves the clock to the next event, the arrival at arrival when
// arriving, and runs the engine steps and the scrape due then; it
// reports whether the arrival is due (the caller sends it).
func (r *engineRun) advance(arrival time.Duration, arriving bool) bool {
	r.now = math.MaxInt64
	if arriving {
		r.now = arrival
	}
	r.now = min(r.now, r.nextScrape)
	for _, w := range r.wake {
		if w >= 0 {
			r.now = min(r.now, w)
		}
	}
	for i, w := range r.wake {
		if w == r.now {
			r.step(i)
		}
	}
	if r.now == r.nextScrape {
		for i, e := range r.engines {
			s := e.Stats()
			r.f.SetLoad(r.ids[i], scrape.Load{Running: s.Running, Waiting: s.Waiting, BlockSize: 16,
				NumBlocks: s.TotalBlocks, KVUsage: float64(s.UsedBlocks) / float64(s.TotalBlocks),
				PrefixQueries: float64(s.PrefixQueries), PrefixHits: float64(s.PrefixHits),
				GenerationTokens: float64(s.OutputTokens), At: r.at(r.now)})
		}
		r.nextScrape += r.scrapeEvery
	}
	return arriving && r.now == arrival
}

// send routes req through the fleet now and hands er to the chosen
// engine.
func (r *engineRun) send(req *Request, er *engine.Request, sc *Scratch) {
	r.t.Helper()
	d, tk := r.f.Decide(req, nil, r.at(r.now), sc)
	if tk == nil {
		r.t.Fatalf("request %s rejected: %s", req.ID, d.Reason)
	}
	r.tickets[req.ID] = tk
	if err := r.engines[d.Replica].Add(r.now, er); err != nil {
		r.t.Fatal(err)
	}
	if r.wake[d.Replica] < 0 {
		r.step(d.Replica)
	}
}

// step runs engine i once and passes its events to the tickets.
func (r *engineRun) step(i int) {
	evs, next := r.engines[i].Step(r.now)
	for _, ev := range evs {
		tk, ok := r.tickets[ev.Req]
		switch {
		case !ok:
		case ev.Kind == engine.FirstToken:
			tk.FirstToken(r.at(ev.At))
		case ev.Kind == engine.Done:
			tk.Done(r.at(ev.At), Usage{PromptTokens: ev.PromptTokens, CachedTokens: ev.CachedTokens,
				CompletionTokens: ev.OutputTokens}, nil)
			if r.onDone != nil {
				r.onDone(ev, tk)
			}
			delete(r.tickets, ev.Req)
			r.done++
		}
	}
	r.wake[i] = -1
	if next != engine.Idle {
		r.wake[i] = max(next, r.now+1)
	}
}

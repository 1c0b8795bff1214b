package scrape

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/poll"
)

// DefaultInterval is the polling period when Scraper.Interval is zero.
const DefaultInterval = 100 * time.Millisecond

// DefaultModelsInterval is the model-list polling period when
// Scraper.ModelsInterval is zero.
const DefaultModelsInterval = 10 * time.Second

// maxBody caps how much of a /metrics response is read (a vLLM endpoint
// serves a few hundred kilobytes at most).
const maxBody = 16 << 20

// Scraper polls the /metrics endpoint of each of its targets, one loop per
// target, and reports every result through its hooks. Targets are replica
// base URLs ("http://10.0.0.1:8000"); the metrics path is appended. A
// second loop per target polls its model list (GET /v1/models, see
// ListModels), at its own period.
//
// Set the exported fields before Run; Add and Remove may be called at any
// time, before or during Run.
type Scraper struct {
	// Client does the requests; nil means a client with no timeout of its
	// own (each request is bounded by Timeout).
	Client *http.Client
	// Interval is the polling period; zero means DefaultInterval.
	Interval time.Duration
	// Timeout bounds one scrape; zero means Interval.
	Timeout time.Duration
	// Path is the metrics path; empty means "/metrics".
	Path string
	// OnLoad, if set, receives every successful scrape, from the target's
	// metrics loop (so calls for one target are ordered).
	OnLoad func(id string, l Load)
	// OnError, if set, receives every failed scrape (of /metrics; model
	// listing errors go to Status only).
	OnError func(id string, err error)
	// ModelsInterval is the model-list polling period per target; zero
	// means DefaultModelsInterval (10 s), negative turns the polling off.
	// One listing is bounded by ModelsTimeout or ModelsInterval, whichever
	// is shorter.
	ModelsInterval time.Duration
	// OnModels, if set, receives every successful model listing, from the
	// target's model loop (so calls for one target are ordered among
	// themselves, not with OnLoad). It must not modify the slice.
	OnModels func(id string, models []Model)
	// OnUnknown, if set, is called once per target, the first time its
	// metrics page has none of the families Parse knows (its load then
	// reads as idle): the engine is not one kvrouter reads, or its
	// metrics are off.
	OnUnknown func(id string)
	// IdleInterval is the longest time between two scrapes of an idle
	// target: one whose last page had the load families of the one
	// before (Parse's lines, not the whole page) and whose Activity
	// channel did not close meanwhile. An idle target's scrapes back off,
	// the gap doubling in whole Intervals up to IdleInterval; a changed
	// page or a failed scrape brings them back to every Interval, and so
	// does activity, at the start of the next Interval, so that a
	// router's traffic finds its engines' load as fresh as without a
	// backoff. Zero, or less than two Intervals, means no backoff.
	IdleInterval time.Duration
	// Activity, if set, returns a channel that closes when the router
	// next sends target id a request or one of its requests there ends:
	// what ends a backoff at once (IdleInterval); nil means only a
	// changed page ends it. It is called before each scrape, from the
	// target's metrics loop.
	Activity func(id string) <-chan struct{}

	targets poll.Group[*target]
}

// Status is a target's scrape health.
type Status struct {
	// Last is the most recent successful Load (At is when it was taken);
	// Last.At is zero if no scrape has succeeded yet.
	Last Load
	// Errors is the number of consecutive failed scrapes since the last
	// success.
	Errors int
	// Err is the most recent error, nil after a success.
	Err error
	// Models is the most recent successful model list, nil before the
	// first; it must not be modified.
	Models []Model
	// ModelsAt is when Models was listed; zero before the first listing.
	ModelsAt time.Time
	// ModelsErr is the most recent model-listing error, nil after a
	// success.
	ModelsErr error
}

// Age returns how old the last successful scrape is at now; it is a very
// large duration when there has been none.
func (s Status) Age(now time.Time) time.Duration {
	if s.Last.At.IsZero() {
		return time.Duration(1<<63 - 1)
	}
	return now.Sub(s.Last.At)
}

// target is one replica's loop state.
type target struct {
	id string

	// mu guards status, unknown and the slots fields.
	mu     sync.Mutex
	status Status
	// unknown is set once OnUnknown was called.
	unknown bool
	// slots and slotCtx are the last /slots reading (llama.cpp), at
	// slotsAt.
	slots, slotCtx int
	slotsAt        time.Time

	// The metrics loop's own state: the last page (to parse a changed
	// one only) and the backoff (IdleInterval): the Intervals from the
	// last scrape to the next (zero: one) and the Activity channel taken
	// before the last scrape.
	page  memo
	every int
	moved <-chan struct{}
}

// Add starts scraping id (a base URL); adding a present id does nothing.
func (s *Scraper) Add(id string) { s.targets.Add(id, &target{id: id}) }

// Remove stops scraping id; no hook is called for it once Remove returns,
// except for a scrape already delivering.
func (s *Scraper) Remove(id string) { s.targets.Remove(id) }

// Status returns id's scrape status; ok is false for an unknown id.
func (s *Scraper) Status(id string) (st Status, ok bool) {
	t, ok := s.targets.Get(id)
	if !ok {
		return Status{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.status, true
}

// Run scrapes every target until ctx is done, then waits for the loops to
// stop and returns ctx's error. Run must not be called twice at once.
func (s *Scraper) Run(ctx context.Context) error {
	// A replica is scraped and its models listed as soon as it is added:
	// until then its block size and capacity are unknown, and any model
	// may be routed to it.
	loops := []poll.Loop[*target]{{Period: s.interval(), Immediate: true, Do: s.scrapeOnce, Skip: s.skip}}
	if every := s.modelsInterval(); every > 0 {
		loops = append(loops, poll.Loop[*target]{Period: every, Immediate: true, Do: s.listOnce})
	}
	err := s.targets.Run(ctx, loops...)
	if err != nil && err != ctx.Err() {
		return fmt.Errorf("scrape: %w", err)
	}
	return err
}

// scrapeOnce does one scrape of t and reports it.
func (s *Scraper) scrapeOnce(ctx context.Context, _ string, t *target) {
	var moved <-chan struct{}
	if s.Activity != nil && s.idlePeriods() > 1 {
		moved = s.Activity(t.id) // before the scrape: what comes after it moves it
	}
	l, changed, err := s.fetch(ctx, t)
	if err == nil && l.Engine == EngineLlamaCpp {
		s.readSlots(ctx, t, &l)
	}
	if ctx.Err() != nil {
		return // removed or stopping: a canceled scrape is not a failure
	}
	t.every, t.moved = s.nextEvery(t.every, err == nil && !changed && !closed(moved)), moved
	t.mu.Lock()
	if err != nil {
		t.status.Errors++
		t.status.Err = err
	} else {
		t.status.Last, t.status.Errors, t.status.Err = l, 0, nil
	}
	first := err == nil && l.Engine == "" && !t.unknown
	t.unknown = t.unknown || first
	t.mu.Unlock()
	if first && s.OnUnknown != nil {
		s.OnUnknown(t.id)
	}
	switch {
	case err != nil && s.OnError != nil:
		s.OnError(t.id, err)
	case err == nil && s.OnLoad != nil:
		s.OnLoad(t.id, l)
	}
}

// listOnce lists t's models once and reports them.
func (s *Scraper) listOnce(ctx context.Context, _ string, t *target) {
	lctx, cancel := context.WithTimeout(ctx, s.modelsInterval())
	models, err := ListModels(lctx, s.Client, t.id)
	cancel()
	if ctx.Err() != nil {
		return // removed or stopping
	}
	t.mu.Lock()
	if err != nil {
		t.status.ModelsErr = err
	} else {
		t.status.Models, t.status.ModelsAt, t.status.ModelsErr = models, time.Now(), nil
	}
	t.mu.Unlock()
	if err == nil && s.OnModels != nil {
		s.OnModels(t.id, models)
	}
}

// nextEvery is the Intervals from a scrape to the next: one, or, when the
// target was idle, twice the last gap (every), at most IdleInterval.
func (s *Scraper) nextEvery(every int, idle bool) int {
	if !idle {
		return 1
	}
	return min(2*max(every, 1), s.idlePeriods())
}

// skip is the metrics loop's poll.Loop.Skip: the Intervals t's backoff
// leaves out, and the Activity channel that ends it.
func (s *Scraper) skip(_ string, t *target) (int, <-chan struct{}) {
	return max(t.every, 1) - 1, t.moved
}

// idlePeriods is the most Intervals between two scrapes of an idle
// target (IdleInterval), at least 1.
func (s *Scraper) idlePeriods() int {
	return max(int(s.IdleInterval/s.interval()), 1)
}

// closed reports whether ch is closed; false for nil.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// fetch GETs and parses one /metrics response of t; changed is false when
// its load families are the last page's (t.page).
func (s *Scraper) fetch(ctx context.Context, t *target) (l Load, changed bool, err error) {
	asked := time.Now()
	ctx, cancel := context.WithTimeout(ctx, s.timeout())
	defer cancel()
	url := strings.TrimSuffix(t.id, "/") + s.path()
	resp, err := get(ctx, s.Client, url, "text/plain;version=0.0.4")
	if err != nil {
		return Load{}, true, err
	}
	defer resp.Body.Close()
	l, changed, err = t.page.parse(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return Load{}, true, fmt.Errorf("scrape %s: %w", url, err)
	}
	l.At, l.Asked = time.Now(), asked
	return l, changed, nil
}

// readSlots fills l's slot count and context from t's last /slots
// reading, read again when older than the model-list period. A failed
// read keeps the last one.
func (s *Scraper) readSlots(ctx context.Context, t *target, l *Load) {
	every := s.modelsInterval()
	if every <= 0 {
		every = DefaultModelsInterval
	}
	t.mu.Lock()
	stale := time.Since(t.slotsAt) >= every
	t.mu.Unlock()
	if stale {
		sctx, cancel := context.WithTimeout(ctx, s.timeout())
		n, nCtx, err := Slots(sctx, func(ctx context.Context, url string) (io.ReadCloser, error) {
			resp, err := get(ctx, s.Client, url, "application/json")
			if err != nil {
				return nil, err
			}
			return resp.Body, nil
		}, t.id)
		cancel()
		t.mu.Lock()
		if err == nil {
			t.slots, t.slotCtx = n, nCtx
		}
		t.slotsAt = time.Now()
		t.mu.Unlock()
	}
	t.mu.Lock()
	l.Slots, l.SlotContext = t.slots, t.slotCtx
	t.mu.Unlock()
}

// get GETs url with client (nil means http.DefaultClient) and returns the
// response if its status is 200; the caller closes its body. Any other
// status is an error.
func get(ctx context.Context, client *http.Client, url, accept string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	req.Header.Set("Accept", accept)
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		return nil, fmt.Errorf("scrape %s: status %s", url, resp.Status)
	}
	return resp, nil
}

func (s *Scraper) interval() time.Duration {
	if s.Interval > 0 {
		return s.Interval
	}
	return DefaultInterval
}

func (s *Scraper) timeout() time.Duration {
	if s.Timeout > 0 {
		return s.Timeout
	}
	return s.interval()
}

// modelsInterval is the model-list period; not positive means off.
func (s *Scraper) modelsInterval() time.Duration {
	if s.ModelsInterval == 0 {
		return DefaultModelsInterval
	}
	return s.ModelsInterval
}

func (s *Scraper) path() string {
	if s.Path != "" {
		return s.Path
	}
	return "/metrics"
}

// Offset is the delay before a replica's first scrape: a hash of its id
// (FNV-1a) reduced modulo the interval, so that loops do not align; zero if
// the interval is not positive. It is poll.Offset.
func Offset(id string, interval time.Duration) time.Duration { return poll.Offset(id, interval) }

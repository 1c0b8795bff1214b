// Package fleet owns the live router's view of its replicas: health, the
// latest scraped engine load, the router's own in-flight accounting,
// session bindings, recent prefill and learned timing rates. It produces
// the immutable route.Snapshot the policy reads, and a View for dashboards.
//
// Hot per-replica counters are atomics; everything else is guarded by the
// mutexes documented on each struct. No lock is held across I/O: fleet does
// no I/O at all. Feed it from package scrape (SetLoad), package health
// (SetHealthy) and the proxy (Commit/Acquire, Ticket, ObserveTTFT).
package fleet

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"kvrouter/route"
	"kvrouter/scrape"
)

// DefaultSessionTTL is how long an idle session stays bound when
// Config.SessionTTL is zero.
const DefaultSessionTTL = 10 * time.Minute

// ErrUnknownReplica is returned for an id that is not (or no longer) in the
// fleet.
var ErrUnknownReplica = errors.New("fleet: unknown replica")

// Config describes a fleet.
type Config struct {
	// Replicas are the replicas' ids (base URLs), in snapshot order.
	Replicas []string
	// Rates is the timing preset every replica starts from (e.g.
	// engine.Config.Rates()); zero fields mean route's defaults.
	Rates route.Rates
	// BlockSize is the snapshot's tokens per block (route.Snapshot.BlockSize);
	// zero means 16.
	BlockSize int
	// CacheBlocks is a replica's KV capacity in BlockSize blocks when its
	// metrics do not report one; zero means unknown.
	CacheBlocks int
	// SessionTTL is how long an idle session stays bound; zero means 10 min.
	SessionTTL time.Duration
	// Window is the span of route.Replica.RecentPrefill (route.Needs.Window);
	// zero means RecentPrefill is not tracked (always zero).
	Window time.Duration
	// Calibration is the template of each replica's Calibrator (its tuning
	// fields); the zero value uses the Calibrator defaults.
	Calibration Calibrator
}

// Fleet is the live state of a set of replicas. Its methods are safe for
// concurrent use.
type Fleet struct {
	cfg Config

	// mu guards reps and byID. Replica structs themselves are never
	// reallocated: a removed replica's outstanding tickets release into it
	// harmlessly.
	mu   sync.RWMutex
	reps []*replica
	byID map[string]*replica

	// smu guards sessions and lastSweep.
	smu       sync.Mutex
	sessions  map[string]*session
	lastSweep time.Time
}

// replica is one backend's state.
type replica struct {
	id string
	// index is the replica's position in Fleet.reps; guarded by Fleet.mu.
	index int

	healthy atomic.Bool
	// The router's own accounting, released by Ticket.Done.
	inFlight, prefillTokens, decoding, decodeBlocks atomic.Int64
	// Feedback totals, for the View.
	predictedCached, actualCached, completed, failed atomic.Int64
	// promptTokens and usageCached total the requests that reported both.
	promptTokens, usageCached atomic.Int64

	// mu guards load, scraped, cal, churn, rates and recent.
	mu      sync.Mutex
	load    scrape.Load
	scraped bool
	cal     Calibrator
	churn   Churn
	recent  recent
	// rates is the preset corrected by cal and churn, recomputed when they
	// change.
	rates route.Rates

	// pub is what snapshots read of the state above, published anew on
	// every change so that a snapshot takes no lock (except for recent).
	pub atomic.Pointer[published]
}

// published is a replica's scrape and rates as snapshots copy them:
// immutable once stored in replica.pub.
type published struct {
	scraped          bool
	running, waiting int
	kvUsage          float64
	loadAt           time.Time
	cacheBlocks      int
	rates            route.Rates
}

// updateLocked recomputes r.rates from f's preset and publishes r's state;
// r.mu is held.
func (f *Fleet) updateLocked(r *replica) {
	r.rates = r.cal.Apply(f.cfg.Rates)
	if h := r.churn.Horizon(); h > 0 {
		r.rates.Horizon = h
	}
	r.pub.Store(&published{
		scraped: r.scraped, running: r.load.Running, waiting: r.load.Waiting, kvUsage: r.load.KVUsage,
		loadAt: r.load.At, cacheBlocks: f.cacheBlocksLocked(r), rates: r.rates,
	})
}

// New returns a fleet of cfg.Replicas, all healthy and unscraped. Duplicate
// or empty ids are an error.
func New(cfg Config) (*Fleet, error) {
	if cfg.BlockSize < 0 || cfg.CacheBlocks < 0 || cfg.SessionTTL < 0 || cfg.Window < 0 {
		return nil, errors.New("fleet: negative BlockSize, CacheBlocks, SessionTTL or Window")
	}
	f := &Fleet{cfg: cfg, byID: make(map[string]*replica), sessions: make(map[string]*session)}
	for _, id := range cfg.Replicas {
		if err := f.AddReplica(id); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// AddReplica appends a replica, healthy and unscraped, at the end of the
// snapshot order.
func (f *Fleet) AddReplica(id string) error {
	if id == "" {
		return errors.New("fleet: empty replica id")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.byID[id]; ok {
		return fmt.Errorf("fleet: duplicate replica %q", id)
	}
	r := &replica{id: id, index: len(f.reps), cal: f.cfg.Calibration}
	r.cal.logScale, r.cal.n = 0, 0
	f.updateLocked(r) // r is not shared yet
	r.healthy.Store(true)
	f.reps = append(f.reps, r)
	f.byID[id] = r
	return nil
}

// RemoveReplica drops a replica and unbinds its sessions. Later replicas
// move up one place in the snapshot order. Tickets still open on it stay
// valid and release harmlessly.
func (f *Fleet) RemoveReplica(id string) error {
	f.mu.Lock()
	r, ok := f.byID[id]
	if !ok {
		f.mu.Unlock()
		return fmt.Errorf("remove %q: %w", id, ErrUnknownReplica)
	}
	delete(f.byID, id)
	f.reps = append(f.reps[:r.index], f.reps[r.index+1:]...)
	for i, q := range f.reps {
		q.index = i
	}
	f.mu.Unlock()
	r.healthy.Store(false)
	f.unbindReplica(r)
	return nil
}

// Replicas returns the replica ids in snapshot order.
func (f *Fleet) Replicas() []string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	ids := make([]string, len(f.reps))
	for i, r := range f.reps {
		ids[i] = r.id
	}
	return ids
}

// lookup returns the replica with id, or nil.
func (f *Fleet) lookup(id string) *replica {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.byID[id]
}

// SetHealthy sets a replica's health flag; unknown ids are ignored. Its
// signature fits health.Checker.OnChange.
func (f *Fleet) SetHealthy(id string, healthy bool) {
	if r := f.lookup(id); r != nil {
		r.healthy.Store(healthy)
	}
}

// Healthy reports a replica's health flag; false for an unknown id.
func (f *Fleet) Healthy(id string) bool {
	r := f.lookup(id)
	return r != nil && r.healthy.Load()
}

// SetLoad records a replica's latest scrape (and feeds its churn estimate);
// unknown ids are ignored. Its signature fits scrape.Scraper.OnLoad.
func (f *Fleet) SetLoad(id string, l scrape.Load) {
	r := f.lookup(id)
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.load, r.scraped = l, true
	r.churn.Observe(l)
	f.updateLocked(r)
}

// ObserveTTFT corrects a replica's rates from one request: predicted is
// the policy's time to first token computed with Scale 1 (Cost.Wait +
// Cost.Prefill + Cost.Decode, unscaled), observed the measured one. See
// Calibrator. Unknown ids are ignored.
func (f *Fleet) ObserveTTFT(id string, predicted, observed time.Duration) {
	r := f.lookup(id)
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cal.Observe(predicted, observed)
	f.updateLocked(r)
}

// blockSize is the snapshot block size.
func (f *Fleet) blockSize() int {
	if f.cfg.BlockSize > 0 {
		return f.cfg.BlockSize
	}
	return route.DefaultBlockSize
}

// cacheBlocksLocked converts the replica's scraped capacity into snapshot
// blocks, or returns the configured default; r.mu is held.
func (f *Fleet) cacheBlocksLocked(r *replica) int {
	if r.scraped && r.load.NumBlocks > 0 && r.load.BlockSize > 0 {
		return r.load.NumBlocks * r.load.BlockSize / f.blockSize()
	}
	return f.cfg.CacheBlocks
}

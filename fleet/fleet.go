// Package fleet owns the router's view of its replicas: health, the models
// each serves, the latest scraped engine load, the router's own in-flight
// accounting, session bindings, recent prefill, learned timing and what
// each replica is believed to cache (a residency.Tracker). It turns a
// request into a decision (Decide: snapshot, match, pin, the policy's
// Pick, commit) and takes the feedback that follows (Ticket, SetLoad,
// SetHealthy, KV events through Tracker().Precise()).
//
// The live router (package proxy) and the simulator (package sim) drive
// the same Fleet: time is always an argument, never read here, so the one
// passes the wall clock and the other its virtual clock, and what the
// simulator shows is what the router does.
//
// Hot per-replica counters are atomics; everything else is guarded by the
// mutexes documented on each struct. No lock is held across I/O: fleet
// does no I/O at all.
package fleet

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/scrape"
	"github.com/kvrouter/kvrouter/window"
)

// Defaults of Config's zero fields.
const (
	// DefaultSessionTTL is how long an idle session stays bound.
	DefaultSessionTTL = 10 * time.Minute
	// DefaultBlockSize is the engine tokens per block assumed for a replica
	// whose metrics and events do not say (vLLM's default).
	DefaultBlockSize = 16
)

// ErrUnknownReplica is returned for an id that is not in the fleet.
var ErrUnknownReplica = errors.New("fleet: unknown replica")

// Config describes a fleet.
type Config struct {
	// Replicas are the replicas at the start, in snapshot order.
	Replicas []Replica
	// MaxReplicas bounds the fleet's size (AddReplica); zero means
	// len(Replicas).
	MaxReplicas int
	// Policy routes the requests (Decide). Its Needs shape the fleet: the
	// index it reads and at what granularity, the recent-prefill window,
	// whether its predictions calibrate the rates. Nil means kv-aware.
	Policy route.Policy
	// Events says the engines' KV events are followed: a policy that asks
	// for a precise index, or reads a generic one, then reads the precise
	// index (see IndexKind).
	Events bool
	// Engine says request chains are engine-aligned (token mode): each
	// replica is matched at its own engine block size, and not before that
	// is known. False is text mode.
	Engine bool
	// TextTokens is the tokens one text-mode block stands for; zero means
	// 16.
	TextTokens int
	// Rates is the timing preset every replica starts from (e.g.
	// engine.Config.Rates()); zero fields mean route's defaults.
	Rates route.Rates
	// BlockSize is the engine tokens per block of a replica whose metrics
	// and events do not say (see SetBlockSize); zero means 16.
	BlockSize int
	// CacheBlocks is a replica's KV capacity in engine blocks until its
	// metrics report one; zero means unknown.
	CacheBlocks int
	// Sessions bound a session to its replica: for how long, and how many.
	Sessions
	// Calibration is the template of each replica's Calibrators (their
	// tuning fields), for Scale, DecodeScale and the streaming decodes'
	// DecodeSpread; the zero value uses the Calibrator defaults.
	Calibration Calibrator
	// OverlayTTL is the life of the precise mode's just-routed overlay;
	// zero means residency.DefaultOverlayTTL.
	OverlayTTL time.Duration
	// Start is time zero of the residency index's clock (index time is
	// now − Start).
	Start time.Time

	// Admission is admission control (Decide answers ReasonSaturated when
	// no replica can take a request in time); the zero value is off.
	Admission Admission
	// OnRelease, when set, is called after a ticket frees load on a replica
	// (its first token ends its prefill, or it is done), so that a queue of
	// requests waiting for a replica can try again. It must not block.
	OnRelease func()
}

// Replica is one replica of Config.
type Replica struct {
	// ID names the replica (its base URL in the live router).
	ID string
	// Models are the model names the replica serves, declared by the
	// operator. Empty means learned from the replica (SetModels), and any
	// model until then.
	Models []string
	// Draining adds the replica draining (see Drain): no request goes to
	// it until Undrain.
	Draining bool
	// Role is its part in a disaggregated fleet; a RolePrefill replica is
	// never a candidate, only a prefill worker (route.Replica.Prefills).
	Role route.Role
	// MaxNumSeqs is the engine's max_num_seqs, as its operator configured
	// it (route.Rates.MaxSeqs of the replica). Zero means learned from its
	// scrapes (the most sequences it ran while others waited; seats), and
	// Config.Rates' until then.
	MaxNumSeqs int
}

// IndexKind returns the residency index a policy with needs reads: a
// policy that asks for the precise index gets it when KV events are
// followed; so does one that reads a generic approximate index (kv-aware,
// Preble's); a peer that fixes its own index's size or expiry models
// another router's approximate index and keeps it. Without events a
// precise policy falls back to the approximate index.
func IndexKind(needs route.Needs, events bool) route.IndexKind {
	switch {
	case needs.Index == route.NoIndex:
		return route.NoIndex
	case !events:
		return route.Approximate
	case needs.Index == route.Precise,
		needs.IndexBlocks == 0 && needs.IndexTTL == 0:
		return route.Precise
	}
	return route.Approximate
}

// Fleet is the state of a set of replicas. Its methods are safe for
// concurrent use.
type Fleet struct {
	cfg    Config
	policy route.Policy
	needs  route.Needs
	kind   route.IndexKind
	tr     *residency.Tracker
	seq    atomic.Uint64 // decisions made
	seqs   atomic.Uint64 // float64 bits of route.Snapshot.Seqs
	preset route.Rates   // Config.Rates with route's defaults filled

	// mu guards reps and byID; replica structs are never reallocated.
	mu   sync.RWMutex
	reps []*replica
	byID map[string]*replica
	// vers are the replicas' versions (replica.ver), MaxReplicas of them
	// side by side, so that a snapshot reads them in a few cache lines.
	vers []atomic.Uint64

	models modelTable
	// cal and dcal total the calibrated replicas' Scale and DecodeScale,
	// for the uncalibrated ones' priors (priorScale).
	cal, dcal calTotals

	// smu guards sessions and lastSweep.
	smu       sync.Mutex
	sessions  sessionTable
	turns     turnTally
	lastSweep time.Time

	// peers is what other routers share with this fleet and it with them
	// (peers.go); unused unless SharePeers is called.
	peers peers
}

// replica is one backend's state.
type replica struct {
	id    string
	index int // position in Fleet.reps
	role  route.Role
	// maxSeqs is Replica.MaxNumSeqs (zero: learned); immutable.
	maxSeqs int
	// ver is bumped after every change of what a snapshot reads of the
	// replica (health, the router's counts, the published state), so that
	// a Scratch rewrites only the replicas whose version moved (snapCache).
	ver *atomic.Uint64

	healthy atomic.Bool
	// llama follows a llama.cpp engine's slots (llamacpp.go); nil for
	// other engines.
	llama atomic.Pointer[slotCache]
	// member is memberServing, memberDraining or memberRemoved
	// (membership.go).
	member atomic.Int32
	// The router's own accounting, released by Ticket.Done.
	inFlight, prefillTokens, decoding, decodeTokens atomic.Int64
	// outputs are its requests in flight that said their output
	// (Claim.Output), and invOut the sum of 1e9/output over them.
	outputs, invOut atomic.Int64
	// share and shareSeq are route.Replica.Share (float64 bits) and
	// ShareSeq, written under mu (arrived).
	share, shareSeq atomic.Uint64
	// linkUntil is when the transfers the router ordered through the
	// replica's interconnect end, in Unix ns; zero: none (bookLinks).
	linkUntil atomic.Int64
	// prefills are its requests not yet at their first token, kept when
	// the fleet transfers (Request.Settled).
	prefills prefills
	// scrapes counts the scrapes taken (SetLoad); gone is the router's
	// requests that the last scrape may have counted in the engine's
	// Running (in flight at some moment between its Asked and At) and
	// that finished since: the snapshot takes them off the scraped
	// Running, which the engine reported before they left. gone is
	// written under mu, from finished (those that ended while the scrape
	// was on its way) and then Ticket.Done.
	scrapes  atomic.Uint64
	gone     atomic.Int64
	finished finishes
	// prefilled is the predicted time, at Scale 1, of the prefills that
	// finished here (at their first token), in all: what lengthened the
	// iterations of the requests decoding meanwhile (observeITL).
	prefilled atomic.Int64
	// work is the predicted time, at Scale 1, of the prefills of the
	// router's requests in flight here, done or not
	// (route.Replica.PrefillWork), released by Ticket.Done.
	work atomic.Int64
	// Feedback totals, for the View (see view.Replica).
	completed, failed                           atomic.Int64
	promptTokens, actualCached, predictedCached atomic.Int64

	// mu guards load, scraped, cal, dcal, scal, churn, rates, recent and
	// the shares.
	mu        sync.Mutex
	load      scrape.Load
	scraped   bool
	cal       Calibrator     // Scale, from times to first token
	dcal      Calibrator     // DecodeScale, from inter-token latencies
	scal      Calibrator     // DecodeSpread before dcal observes, from streaming decodes (Token)
	hits      hitTally       // HitScale, from the engines' cached tokens
	displaced displacedTally // Displaced, from the engines' cached tokens
	churn     Churn
	recent    window.Sums // recent prefill tokens (A)
	rates     route.Rates // the preset corrected by cal, dcal and churn
	// seats is the most sequences a scrape showed running while others
	// waited: the engine's max_num_seqs as far as its load has shown it,
	// zero before a scrape with waiting requests (seats.go).
	seats int
	// seatWatch follows the scrapes in a row that showed the same number
	// running while others waited (seats.go).
	seatWatch seatWatch
	// calShare and dcalShare are r's contributions to Fleet.cal and dcal.
	calShare, dcalShare share

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
	// capTokens is the KV capacity in tokens (zero: unknown).
	capTokens int
	rates     route.Rates
	// calibrated and dcalibrated say Scale and DecodeScale were learned
	// (their Calibrators have observations).
	calibrated, dcalibrated bool
}

// New returns a fleet of cfg.Replicas, all healthy and unscraped.
// Duplicate or empty ids are an error.
func New(cfg Config) (*Fleet, error) {
	if cfg.BlockSize < 0 || cfg.CacheBlocks < 0 || cfg.SessionTTL < 0 || cfg.MaxReplicas < 0 || cfg.MaxSessions < 0 {
		return nil, errors.New("fleet: negative BlockSize, CacheBlocks, SessionTTL, MaxReplicas or MaxSessions")
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = DefaultBlockSize
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.MaxReplicas == 0 {
		cfg.MaxReplicas = max(len(cfg.Replicas), 1)
	}
	if cfg.MaxReplicas > residency.MaxReplicasLimit {
		return nil, fmt.Errorf("fleet: %d replicas > %d", cfg.MaxReplicas, residency.MaxReplicasLimit)
	}
	f := &Fleet{cfg: cfg, policy: cfg.Policy, byID: make(map[string]*replica), sessions: newSessionTable(cfg.MaxSessions),
		vers: make([]atomic.Uint64, cfg.MaxReplicas)}
	if f.policy == nil {
		f.policy = route.KVAware{}
	}
	f.needs = route.NeedsOf(f.policy)
	f.preset = cfg.Rates.WithDefaults()
	f.kind = IndexKind(f.needs, cfg.Events)
	f.tr = f.newTracker()
	for _, r := range cfg.Replicas {
		if err := f.AddReplica(r); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// newTracker builds the residency tracker the policy's Needs ask for.
func (f *Fleet) newTracker() *residency.Tracker {
	tc := residency.TrackerConfig{
		MaxReplicas:     f.cfg.MaxReplicas,
		Approximate:     f.kind != route.NoIndex,
		Precise:         f.kind == route.Precise,
		Engine:          f.cfg.Engine,
		TextTokens:      f.cfg.TextTokens,
		OverlayTTL:      f.cfg.OverlayTTL,
		DefaultCapacity: f.cfg.CacheBlocks,
	}
	if f.kind == route.Approximate {
		tc.Blocks, tc.TTL, tc.CoarseTokens = f.needs.IndexBlocks, f.needs.IndexTTL, f.needs.BlockTokens
	}
	return residency.NewTracker(tc)
}

// Policy returns the fleet's policy.
func (f *Fleet) Policy() route.Policy { return f.policy }

// Needs returns the policy's needs.
func (f *Fleet) Needs() route.Needs { return f.needs }

// Index returns the kind of residency index the policy reads.
func (f *Fleet) Index() route.IndexKind { return f.kind }

// Tracker returns the fleet's residency tracker: engine events write its
// Precise index, and its feed (SetFeed) tells which streams to trust.
func (f *Fleet) Tracker() *residency.Tracker { return f.tr }

// ScrapeInterval is how often engine metrics should reach the fleet: the
// policy's own source's interval when it has one, else def.
func (f *Fleet) ScrapeInterval(def time.Duration) time.Duration {
	if f.needs.ScrapeInterval > 0 {
		return f.needs.ScrapeInterval
	}
	return def
}

// indexTime is now on the index clock.
func (f *Fleet) indexTime(now time.Time) time.Duration { return now.Sub(f.cfg.Start) }

// AddReplica adds a replica, healthy and unscraped: into the slot of a
// removed replica whose requests have all finished (so that no request in
// flight ever sees its index change owner), else at the end of the
// snapshot order.
func (f *Fleet) AddReplica(rc Replica) error {
	if rc.ID == "" {
		return errors.New("fleet: empty replica id")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.byID[rc.ID]; ok {
		return fmt.Errorf("fleet: duplicate replica %q", rc.ID)
	}
	if rc.Role == route.RolePrefill && !f.transfers() {
		return fmt.Errorf("fleet: prefill worker %q in a fleet that does not transfer KV (Rates.TransferPerMTokens is zero: turn KV transfer on)", rc.ID)
	}
	i := f.freeSlotLocked()
	if i < 0 && len(f.reps) >= f.cfg.MaxReplicas {
		return fmt.Errorf("fleet: replica %q beyond MaxReplicas %d: %w", rc.ID, f.cfg.MaxReplicas, ErrFull)
	}
	if i < 0 {
		i = len(f.reps)
		f.reps = append(f.reps, nil)
	} else {
		f.tr.Clear(i) // what a request decided before the removal touched
	}
	r := &replica{id: rc.ID, index: i, role: rc.Role, maxSeqs: max(rc.MaxNumSeqs, 0), ver: &f.vers[i], cal: f.cfg.Calibration}
	r.cal.logScale, r.cal.dev, r.cal.n = 0, 0, 0
	r.dcal, r.scal = r.cal, r.cal
	f.tr.AddReplica(r.index)
	f.updateLocked(r) // r is not shared yet
	r.healthy.Store(true)
	if rc.Draining {
		r.member.Store(memberDraining)
	}
	r.changed()
	f.reps[i] = r
	f.byID[rc.ID] = r
	f.models.set(r.index, rc.Models, len(rc.Models) > 0, true)
	return nil
}

// Replicas returns the replica ids in snapshot order; the slot of a
// removed replica is "".
func (f *Fleet) Replicas() []string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	ids := make([]string, len(f.reps))
	for i, r := range f.reps {
		if r.member.Load() != memberRemoved {
			ids[i] = r.id
		}
	}
	return ids
}

// Len returns the number of replica slots (removed ones included: see
// Members).
func (f *Fleet) Len() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return len(f.reps)
}

// lookup returns the replica with id, or nil.
func (f *Fleet) lookup(id string) *replica {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.byID[id]
}

// At returns the index of replica id in the snapshot order, or -1.
func (f *Fleet) At(id string) int {
	if r := f.lookup(id); r != nil {
		return r.index
	}
	return -1
}

// SetHealthy sets a replica's health flag; unknown ids are ignored.
func (f *Fleet) SetHealthy(id string, healthy bool) {
	if r := f.lookup(id); r != nil && r.healthy.Swap(healthy) != healthy {
		r.changed()
	}
}

// Healthy reports a replica's health flag; false for an unknown id.
func (f *Fleet) Healthy(id string) bool {
	r := f.lookup(id)
	return r != nil && r.healthy.Load()
}

// SetLoad records a replica's latest scrape: its load, its churn (the
// eviction horizon), its KV capacity and block size for the tracker.
// Unknown ids are ignored.
func (f *Fleet) SetLoad(id string, l scrape.Load) {
	r := f.lookup(id)
	if r == nil {
		return
	}
	r.mu.Lock()
	if r.scraped {
		r.seats, r.seatWatch = seatsSeen(r.seats, r.seatWatch, r.load, l)
	}
	r.load, r.scraped = l, true
	r.observeSlots(l)
	r.scrapes.Add(1)
	r.gone.Store(int64(r.finished.since(l)))
	r.churn.Observe(l)
	f.updateLocked(r)
	r.mu.Unlock()
	f.SetBlockSize(id, l.BlockSize)
	if l.NumBlocks > 0 {
		f.tr.SetCapacity(r.index, l.NumBlocks, l.CPUBlocks, f.tr.BlockSize(r.index))
	}
}

// SetBlockSize records a replica's engine tokens per block, from its
// metrics or its KV events; zero (the replica does not say) means
// Config.BlockSize, unless a size is known already. In token mode nothing
// is matched on a replica before its block size is known.
func (f *Fleet) SetBlockSize(id string, tokens int) {
	r := f.lookup(id)
	if r == nil {
		return
	}
	if tokens <= 0 {
		if f.tr.BlockSize(r.index) > 0 {
			return
		}
		tokens = f.cfg.BlockSize
	}
	f.tr.SetBlockSize(r.index, tokens)
}

// BlockSizes returns the distinct engine block sizes known in the fleet,
// smallest first: the chains a token-mode request is hashed at. The slice
// is shared: do not modify it.
func (f *Fleet) BlockSizes() []int { return f.tr.BlockSizes() }

// updateLocked recomputes r.rates from the preset and publishes r's
// state; r.mu is held.
func (f *Fleet) updateLocked(r *replica) {
	r.rates = f.cfg.Rates
	r.rates.Scale = r.calShare.set(&f.cal, &r.cal)
	r.rates.DecodeScale = r.dcalShare.set(&f.dcal, &r.dcal)
	r.rates.Spread, r.rates.DecodeSpread = r.cal.Spread(), r.dcal.Spread()
	if r.dcal.Observations() == 0 {
		r.rates.DecodeSpread = r.scal.Spread() // progress.go
	}
	r.rates.HitScale = r.hits.scale()
	r.rates.Displaced = r.displaced.share()
	calibrated, dcalibrated := r.cal.Observations() > 0, r.dcal.Observations() > 0
	if h := r.churn.Horizon(); h > 0 {
		r.rates.Horizon = h
	}
	r.rates.TierHorizon = r.churn.TierHorizon()
	r.rates.MaxSeqs = r.maxSeqsLocked(r.rates.MaxSeqs)
	p := &published{
		scraped: r.scraped, running: r.load.Running, waiting: r.load.Waiting, kvUsage: r.load.KVUsage,
		loadAt: r.load.At, rates: r.rates, calibrated: calibrated, dcalibrated: dcalibrated,
		capTokens: f.cfg.CacheBlocks * f.cfg.BlockSize,
	}
	if r.scraped && r.load.NumBlocks > 0 && r.load.BlockSize > 0 {
		p.capTokens = r.load.NumBlocks * r.load.BlockSize
	}
	r.pub.Store(p)
	r.changed()
}

// changed bumps r's version: call it after every change of what a
// snapshot reads of r.
func (r *replica) changed() { r.ver.Add(1) }

// arrived counts in r's share of the router's requests (route.Replica.Share)
// the one decision seq sent it, on a fleet of n replicas.
func (r *replica) arrived(seq uint64, n int) {
	r.mu.Lock()
	prev := r.shareSeq.Load()
	r.share.Store(math.Float64bits(route.Arrived(math.Float64frombits(r.share.Load()), prev, seq, n)))
	r.shareSeq.Store(max(prev, seq))
	r.mu.Unlock()
	r.changed()
}

package proxy

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/hashing"
	"github.com/kvrouter/kvrouter/health"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/scrape"
)

// state wires the router's live view of the fleet from its packages: fleet
// (in-flight accounting, sessions, models, calibration, residency
// tracking, decisions: the same code the simulator runs), hashing (request
// → block chains), health (active /health probes plus the failures the
// proxy reports), scrape (/metrics loops) and, in precise mode, the
// KV-event feed (precise.go). Replica i is bes.at(i) everywhere: in the
// fleet's snapshot order, in the tracker and in the KV-event feed; at
// start it is cfg.Backends[i] (members.go changes the set).
type state struct {
	bes backendSet
	// maxBackends is the most backends at once (Config.MaxBackends).
	maxBackends int
	log         *slog.Logger
	epoch       uint64 // random per router, part of request ids
	fleet       *fleet.Fleet
	hasher      *hashing.Hasher
	health      *health.Checker
	scraper     *scrape.Scraper
	feed        *precise // nil unless KV events are followed
	pickRR      atomic.Uint64
	// m counts ejections; set by New once the metrics exist (nil: not
	// counted).
	m *metrics
	// hung, per slot (maxBackends of them), is done (and replaced) when failed probes eject
	// the replica: the attempts waiting on it for an answer or a first
	// token give up then rather than at their timeout.
	hung []atomic.Pointer[hungSignal]
	// back is closed (and replaced) when a replica becomes routable:
	// requests and retries held because none was pick again then.
	back atomic.Pointer[chan struct{}]
}

// newState builds the router's state for cfg over upstream, with policy, on the clock now whose reading at the
// router's start is start; onRelease is the fleet's Config.OnRelease.
func newState(cfg *Config, policy route.Policy, upstream http.RoundTripper, log *slog.Logger, now func() time.Time, start time.Time, onRelease func(), cal fleet.Calibrator) (*state, error) {
	ecfg, err := engine.Preset(cfg.Preset)
	if err != nil {
		return nil, fmt.Errorf("preset: %w", err)
	}
	var b [8]byte
	rand.Read(b[:])
	st := &state{log: log, epoch: binary.LittleEndian.Uint64(b[:]) >> 16, maxBackends: cfg.maxBackends()}
	for i, be := range cfg.Backends {
		b, err := newBackend(be)
		if err != nil {
			return nil, err
		}
		st.bes.setLocked(i, b)
		st.bes.own(be.URL, SourceConfig)
	}
	st.hasher, err = hashing.New(hashing.Config{
		ChunkChars: cfg.ChunkChars, Tokenizer: cfg.Tokenizer, Tokenizers: cfg.Tokenizers,
		Client: &http.Client{Transport: upstream}, Pick: st.pickHealthy,
		Engine: st.engineOf, OnFallback: (&fallbackLog{st: st}).note,
	})
	if err != nil {
		return nil, err
	}
	cacheBlocks := ecfg.NumBlocks
	if cfg.CacheBlocks > 0 {
		cacheBlocks = cfg.CacheBlocks
	}
	reps := make([]fleet.Replica, len(cfg.Backends))
	for i, be := range cfg.Backends {
		reps[i] = fleet.Replica{ID: be.URL, Models: be.Models, Role: be.Role, MaxNumSeqs: be.MaxNumSeqs}
	}
	st.fleet, err = fleet.New(fleet.Config{
		Replicas:    reps,
		MaxReplicas: st.maxBackends,
		Policy:      policy,
		Events:      cfg.Precise(),
		Engine:      st.hasher.Engine(),
		TextTokens:  st.hasher.TextTokens(),
		Rates:       scaleRates(presetRates(ecfg, cfg.KVTransfer, cfg.InterconnectGBps), cfg.TimeScale),
		CacheBlocks: cacheBlocks,
		Sessions:    cfg.Sessions,
		Start:       start,
		Admission:   cfg.fleetAdmission(),
		OnRelease:   onRelease,
		Calibration: cal,
	})
	if err != nil {
		return nil, err
	}
	if st.fleet.Index() == route.Precise {
		if st.feed, err = startPrecise(cfg, &st.bes, st.fleet, log, now, start); err != nil {
			return nil, err
		}
	}
	st.health = &health.Checker{
		Client:       &http.Client{Transport: upstream},
		Interval:     cfg.HealthInterval,
		Timeout:      max(cfg.HealthInterval, health.DefaultTimeout),
		Path:         cfg.HealthPath,
		Outlier:      cfg.Outlier,
		Models:       st.declared,
		OnChange:     st.onRoutable,
		OnPanic:      st.onPanic,
		OnOverrule:   st.onOverrule,
		OnTransition: st.onHealth,
		OnFallback:   st.onHealthFallback,
		OnEject:      st.onEject,
		OnHold:       st.onHold,
	}
	interval := st.fleet.ScrapeInterval(cfg.ScrapeInterval)
	st.scraper = &scrape.Scraper{
		Client:         &http.Client{Transport: upstream},
		Interval:       interval,
		IdleInterval:   cfg.ScrapeIdleInterval,
		Activity:       st.fleet.Activity,
		Timeout:        max(interval, time.Second),
		OnLoad:         st.fleet.SetLoad,
		OnError:        st.onScrapeError,
		OnModels:       st.fleet.SetModels,
		OnUnknown:      st.onUnknownMetrics,
		ModelsInterval: cfg.ModelsInterval,
	}
	back := make(chan struct{})
	st.back.Store(&back)
	st.hung = make([]atomic.Pointer[hungSignal], st.maxBackends)
	for i := range st.hung {
		st.hung[i].Store(newHungSignal())
	}
	for _, be := range st.bes.list() {
		st.health.Add(be.cfg.URL)
		st.scraper.Add(be.cfg.URL)
	}
	return st, nil
}

// declared returns the models the operator declared for backend id.
func (st *state) declared(id string) []string {
	if i := st.fleet.At(id); i >= 0 {
		return st.bes.at(i).cfg.Models
	}
	return nil
}

// scaleRates returns r with every duration multiplied by timeScale (wall
// seconds per engine second; zero or 1 leaves r as it is). Horizon,
// Scale and DecodeScale are learned, not the preset's, and stay. A zero duration (route's
// default) stays zero: engine.Config.Rates fills every field.
// presetRates is the cost model's start from the engines' preset: its
// timing, the load time of a CPU tier's blocks, which earn credit when the
// engines report some (precise mode), and with transfer (--kv-transfer)
// the interconnect's at gbps GB/s (zero: the preset's), so that the policy
// may order KV imports.
func presetRates(ecfg engine.Config, transfer bool, gbps float64) route.Rates {
	rt := ecfg.Rates()
	rt.LoadPerMTokens = ecfg.LoadPerMTokens()
	if transfer {
		if gbps > 0 {
			ecfg.InterconnectGBps = gbps
		}
		rt.TransferPerMTokens = ecfg.TransferPerMTokens()
	}
	return rt
}

func scaleRates(r route.Rates, timeScale float64) route.Rates {
	if timeScale <= 0 || timeScale == 1 {
		return r
	}
	scale := func(d time.Duration) time.Duration {
		if d <= 0 {
			return d // zero: route's default, which is not scaled
		}
		return max(time.Duration(math.Round(float64(d)*timeScale)), 1) // never zero: that would mean the default
	}
	r.PrefillPerToken = scale(r.PrefillPerToken)
	r.AttnPerMPairs = scale(r.AttnPerMPairs)
	r.DecodeStep = scale(r.DecodeStep)
	r.StepOverhead = scale(r.StepOverhead)
	r.DecodePerSeq = scale(r.DecodePerSeq)
	r.DecodePerMTokens = scale(r.DecodePerMTokens)
	r.TransferPerMTokens = scale(r.TransferPerMTokens)
	r.LoadPerMTokens = scale(r.LoadPerMTokens)
	return r
}

// onScrapeError notes that a replica's metrics could not be read: in token
// mode its block size then falls back to the default, so that an engine
// without /metrics is still matched.
func (st *state) onScrapeError(id string, err error) { st.fleet.SetBlockSize(id, 0) }

// onHealth logs the health checker's transitions, with the reason.
func (st *state) onHealth(id string, healthy bool, reason string) {
	if healthy {
		st.log.Info("replica up", "replica", id, "reason", reason)
	} else {
		st.log.Warn("replica down", "replica", id, "reason", reason)
	}
}

// onHealthFallback logs how a replica without /health is checked instead.
func (st *state) onHealthFallback(id, note string) {
	st.log.Info("health check changed", "replica", id, "note", note)
}

// onEject counts an ejection (its transition is logged by onHealth) and,
// when probes ejected the replica (it does not answer /health), tells the
// attempts waiting on it.
func (st *state) onEject(id string, e health.Ejection) {
	if st.m != nil {
		st.m.ejections.WithLabelValues(id, e.Kind).Inc()
	}
	if e.Kind != health.KindProbe {
		return
	}
	if i := st.fleet.At(id); i >= 0 && i < len(st.hung) {
		st.hung[i].Swap(newHungSignal()).eject()
	}
}

// hungSignal is done when probes next eject a replica: a context, so
// that an attempt waiting on its replica registers a callback
// (context.AfterFunc) rather than a goroutine of its own.
type hungSignal struct {
	ctx   context.Context
	eject context.CancelFunc
}

func newHungSignal() *hungSignal {
	ctx, cancel := context.WithCancel(context.Background())
	return &hungSignal{ctx: ctx, eject: cancel}
}

// otherHealthy reports whether a replica other than i is in service on
// evidence (not only routable in panic mode).
func (st *state) otherHealthy(i int) bool {
	for j, be := range st.bes.list() {
		if j != i && st.healthy(j) && st.health.Healthy(be.cfg.URL) {
			return true
		}
	}
	return false
}

// backSignal returns the channel closed when a replica next returns to
// service.
func (st *state) backSignal() <-chan struct{} { return *st.back.Load() }

// hungSignal returns what is done when probes next eject replica i.
func (st *state) hungSignal(i int) context.Context { return st.hung[i].Load().ctx }

// onHold logs and counts a replica kept out at the end of its ejection.
func (st *state) onHold(id, reason string) {
	st.log.Warn("replica kept out", "replica", id, "reason", reason)
	if st.m != nil {
		st.m.readmitted.WithLabelValues(id).Inc()
	}
}

// eject takes replica i out of service at once: it refused a connection.
func (st *state) eject(i int, reason string) {
	st.health.Eject(st.bes.at(i).cfg.URL, "connect: "+reason)
}

// reportFailure feeds passive health: a request to replica i failed
// (connect error, 5xx, broken stream).
func (st *state) reportFailure(i int) { st.health.ReportFailure(st.bes.at(i).cfg.URL) }

// reportSuccess feeds passive health: a request to replica i succeeded.
func (st *state) reportSuccess(i int) { st.health.ReportSuccess(st.bes.at(i).cfg.URL) }

// healthy reports whether replica i may get traffic.
func (st *state) healthy(i int) bool { return st.fleet.Healthy(st.bes.at(i).cfg.URL) }

// run runs the scrape loops, the health probes and in precise mode the
// KV-event watch until ctx is done, and joins them.
func (st *state) run(ctx context.Context) error {
	var wg sync.WaitGroup
	var herr error
	wg.Go(func() { herr = st.health.Run(ctx) })
	if st.feed != nil {
		wg.Go(func() { st.feed.watch(ctx) })
	}
	serr := st.scraper.Run(ctx)
	wg.Wait()
	return quiet(errors.Join(serr, herr))
}

// quiet drops the context errors that end every run.
func quiet(err error) error {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	return err
}

// logIndexMode says at start which residency feed and hash mode the
// policy named name gets, and why KV events are not followed when cfg
// configures them but the policy does not read them.
func (st *state) logIndexMode(cfg *Config, name string) {
	needs, log := st.fleet.Needs(), st.log
	hash := st.hasher.Mode()
	switch {
	case needs.Index == route.NoIndex && cfg.Precise():
		log.Warn("kv events configured, but the policy reads no residency index: not following them", "policy", name, "bind", cfg.KVEventsBind)
	case needs.Index == route.NoIndex:
		log.Info("policy reads no residency index", "policy", name)
	case st.feed != nil:
		log.Info("precise mode: following the engines' KV events", "policy", name, "hash", hash, "bind", cfg.KVEventsBind)
	case cfg.Precise():
		log.Warn("kv events configured, but the policy keeps its own approximate index: not following them", "policy", name, "bind", cfg.KVEventsBind)
	case needs.Index == route.Precise:
		log.Warn("policy asks for a precise (KV-event) index; none is configured (backend kv= or --kv-events-bind), using the approximate one", "policy", name)
	default:
		log.Info("approximate mode: tracking residency from routing decisions", "policy", name, "hash", hash)
	}
}

// Index feeds, as decision records and views name them.
const (
	IndexNone        = "none"
	IndexApproximate = "approximate"
	IndexPrecise     = "precise"
)

// indexMode names the router's residency feed: precise when KV events are
// followed (some replicas may be falling back), else approximate or none.
func (st *state) indexMode() string {
	switch st.fleet.Index() {
	case route.NoIndex:
		return IndexNone
	case route.Precise:
		return IndexPrecise
	}
	return IndexApproximate
}

// pickHealthy returns a healthy replica's base URL, round robin, or "".
func (st *state) pickHealthy() string {
	bes := st.bes.list()
	n := len(bes)
	if n == 0 {
		return ""
	}
	start := int(st.pickRR.Add(1) % uint64(n))
	for k := range n {
		if i := (start + k) % n; st.healthy(i) {
			return st.bes.at(i).cfg.URL
		}
	}
	return ""
}

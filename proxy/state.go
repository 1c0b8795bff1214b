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

	"kvrouter/engine"
	"kvrouter/fleet"
	"kvrouter/health"
	"kvrouter/route"
	"kvrouter/scrape"
)

// state wires the router's live view of the fleet from its packages:
// fleet (in-flight accounting through tickets, sessions, scraped load,
// TTFT calibration, eviction horizon, snapshots), health (active /health
// probes plus the failures the proxy reports), scrape (/metrics loops) and
// the residency index (index.go). Replica i is cfg.Backends[i] everywhere:
// in the fleet's snapshot order, in the index and in rt.names.
type state struct {
	rt      *Router
	epoch   uint64 // random per router, part of request ids
	fleet   *fleet.Fleet
	health  *health.Checker
	scraper *scrape.Scraper
	idx     *index
	tok     *tokenHasher     // nil in text mode
	remote  *remoteTokenizer // nil unless a model is tokenized remotely
	pickRR  atomic.Uint64    // round robin of pickHealthy
	// calibrate is set when the policy's Cost terms are kv-aware durations
	// that ObserveTTFT may compare with observed TTFTs.
	calibrate bool
}

func newState(rt *Router, needs route.Needs) (*state, error) {
	ecfg, err := engine.Preset(rt.cfg.Preset)
	if err != nil {
		return nil, fmt.Errorf("preset: %w", err)
	}
	var b [8]byte
	rand.Read(b[:])
	st := &state{rt: rt, epoch: binary.LittleEndian.Uint64(b[:]) >> 16}
	_, st.calibrate = rt.policy.(route.KVAware)
	h, err := st.newHasher()
	if err != nil {
		return nil, err
	}
	// Fallback capacity, in the hasher's blocks: the configured engine
	// blocks of the preset's size, else the preset's own.
	engineBlocks := ecfg.NumBlocks
	if rt.cfg.CacheBlocks > 0 {
		engineBlocks = rt.cfg.CacheBlocks
	}
	fallback := engineBlocks * ecfg.BlockSize / h.TokensPerBlock()
	st.idx = newIndex(h, needs, len(rt.names), fallback)
	if rt.cfg.Precise() && usesPrecise(needs) {
		p, err := startPrecise(&rt.cfg, rt.names, engineBlocks, func() time.Duration { return time.Since(st.idx.start) }, rt.log)
		if err != nil {
			return nil, err
		}
		st.idx.p = p
	}
	st.fleet, err = fleet.New(fleet.Config{
		Replicas:    rt.names,
		Rates:       scaleRates(ecfg.Rates(), rt.cfg.TimeScale),
		BlockSize:   h.TokensPerBlock(),
		CacheBlocks: fallback,
		SessionTTL:  rt.cfg.SessionTTL,
		Window:      needs.Window,
	})
	if err != nil {
		return nil, err
	}
	st.health = &health.Checker{
		Client:   &http.Client{Transport: rt.upstream},
		Interval: rt.cfg.HealthInterval,
		Timeout:  max(rt.cfg.HealthInterval, health.DefaultTimeout),
		OnChange: st.onHealth,
	}
	st.scraper = &scrape.Scraper{
		Client:   &http.Client{Transport: rt.upstream},
		Interval: rt.cfg.ScrapeInterval,
		Timeout:  max(rt.cfg.ScrapeInterval, time.Second),
		OnLoad:   st.onLoad,
	}
	for _, name := range rt.names {
		st.health.Add(name)
		st.scraper.Add(name)
	}
	return st, nil
}

// scaleRates returns r with every duration multiplied by timeScale (wall
// seconds per engine second; zero or 1 leaves r as it is). Horizon and
// Scale are learned, not the preset's, and stay. A zero duration (route's
// default) stays zero: engine.Config.Rates fills every field.
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
	r.AttnPerToken2 = scale(r.AttnPerToken2)
	r.DecodeStep = scale(r.DecodeStep)
	r.DecodePerSeq = scale(r.DecodePerSeq)
	return r
}

// replica returns the index of the replica named id, or -1.
func (st *state) replica(id string) int {
	for i, n := range st.rt.names {
		if n == id {
			return i
		}
	}
	return -1
}

// onLoad takes one scrape: load, churn and capacity.
func (st *state) onLoad(id string, l scrape.Load) {
	st.fleet.SetLoad(id, l)
	if st.tok != nil {
		st.tok.setBlockSize(l.BlockSize)
	}
	if i := st.replica(id); i >= 0 {
		st.idx.setEngineCapacity(i, l.NumBlocks, l.BlockSize)
	}
}

// onHealth follows the health checker's transitions.
func (st *state) onHealth(id string, healthy bool) {
	st.fleet.SetHealthy(id, healthy)
	if healthy {
		st.rt.log.Info("replica up", "replica", id)
	} else {
		st.rt.log.Warn("replica down", "replica", id)
	}
}

// reportFailure feeds passive health: a request to replica i failed
// (connect error, 5xx, broken stream).
func (st *state) reportFailure(i int) { st.health.ReportFailure(st.rt.names[i]) }

// reportSuccess feeds passive health: a request to replica i succeeded.
func (st *state) reportSuccess(i int) { st.health.ReportSuccess(st.rt.names[i]) }

// snapshot fills dst with every replica's state at now, index blocks
// included, and uncalibrated replicas given the fleet's mean scale.
func (st *state) snapshot(dst *route.Snapshot, now time.Time) {
	st.fleet.Snapshot(dst, now)
	st.idx.fillBlocks(dst)
	priorScale(dst)
}

// priorScale gives replicas that have no TTFT observation yet (Scale
// exactly 1 or unset) the geometric mean of the others' learned scales.
// Without it, once one replica is calibrated (say to 0.3: the engines are
// faster than the preset) every uncalibrated one looks 3× slower and gets
// no traffic to calibrate on. fleet does not expose observation counts, so
// an exact 1 stands for "none" (a learned scale is practically never
// exactly 1).
func priorScale(s *route.Snapshot) {
	sum, n := 0.0, 0
	for i := range s.Replicas {
		if sc := s.Replicas[i].Rates.Scale; sc > 0 && sc != 1 {
			sum += math.Log(sc)
			n++
		}
	}
	if n == 0 || n == len(s.Replicas) {
		return
	}
	mean := math.Exp(sum / float64(n))
	for i := range s.Replicas {
		if sc := s.Replicas[i].Rates.Scale; sc <= 0 || sc == 1 {
			s.Replicas[i].Rates.Scale = mean
		}
	}
}

// healthy reports whether replica i may get traffic.
func (st *state) healthy(i int) bool { return st.fleet.Healthy(st.rt.names[i]) }

// run runs the scrape loops and the health probes until ctx is done, and
// joins them.
func (st *state) run(ctx context.Context) error {
	var wg sync.WaitGroup
	var herr error
	wg.Go(func() { herr = st.health.Run(ctx) })
	if st.idx.p != nil {
		wg.Go(func() { st.idx.p.watch(ctx) })
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

func newPolicy(name string) (route.Policy, error) {
	if name == "" {
		name = route.Default
	}
	return route.New(name)
}

// logIndexMode says at start which residency feed and hash mode the
// policy gets.
func (st *state) logIndexMode(log *slog.Logger, needs route.Needs) {
	hash := hashText
	if st.tok != nil {
		hash = hashTokens
	}
	switch {
	case needs.Index == route.NoIndex:
		log.Debug("policy reads no residency index", "policy", st.rt.policyName)
	case st.idx.p != nil:
		log.Info("precise mode: following the engines' KV events", "policy", st.rt.policyName, "hash", hash, "bind", st.rt.cfg.KVEventsBind)
	case st.rt.cfg.Precise():
		log.Warn("kv events configured, but the policy keeps its own approximate index; not following them", "policy", st.rt.policyName)
	case needs.Index == route.Precise:
		log.Warn("policy asks for a precise (KV-event) index; none is configured (backend kv= or --kv-events-bind), using the approximate one", "policy", st.rt.policyName)
	default:
		log.Info("approximate mode: tracking residency from routing decisions", "policy", st.rt.policyName, "hash", hash)
	}
}

// usesPrecise reports whether a policy with needs reads the precise index
// when KV events are configured: one that asks for it, or one that reads a
// generic approximate index. Peer policies that fix their own index shape
// (IndexBlocks, IndexTTL: they model another router's approximate index)
// keep it.
func usesPrecise(needs route.Needs) bool {
	return needs.Index == route.Precise ||
		needs.Index == route.Approximate && needs.IndexBlocks == 0 && needs.IndexTTL == 0
}

// newHasher returns the text-mode hasher, or the token-mode one when the
// configuration names tokenizers.
func (st *state) newHasher() (hasher, error) {
	cfg := &st.rt.cfg
	if !cfg.TokenMode() {
		return newTextHasher(cfg.ChunkChars), nil
	}
	remote := cfg.Tokenizer == Remote
	for _, v := range cfg.Tokenizers {
		remote = remote || v == Remote
	}
	if remote {
		st.remote = newRemoteTokenizer(&http.Client{Transport: st.rt.upstream}, st.pickHealthy)
	}
	h, err := newTokenHasher(cfg, st.remote)
	if err != nil {
		return nil, err
	}
	st.tok = h
	return h, nil
}

// pickHealthy returns a healthy replica's base URL, round robin, or "".
func (st *state) pickHealthy() string {
	n := len(st.rt.names)
	start := int(st.pickRR.Add(1) % uint64(n))
	for k := range n {
		if i := (start + k) % n; st.healthy(i) {
			return st.rt.names[i]
		}
	}
	return ""
}

package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"sync/atomic"
	"time"

	"kvrouter/kvevents"
	"kvrouter/prefix"
	"kvrouter/residency"
)

// overlayTTL is how long a routing decision's blocks count as resident on
// the chosen replica in precise mode, covering the moments between the
// decision and the engine's BlockStored events (the engine stores a
// prompt's blocks as its prefill completes).
const overlayTTL = 3 * time.Second

// watchInterval is how often each replica's event-stream health is read
// to switch it between precise and approximate matching.
const watchInterval = 50 * time.Millisecond

// precise is the KV-event side of the index: the precise residency index
// the Subscriber writes, the just-routed overlay, and per replica whether
// its stream is healthy (live: matched against x) or not (matched against
// the approximate index).
type precise struct {
	x       *residency.Index
	overlay *residency.Index
	sub     *kvevents.Subscriber
	// followed is true for replicas whose events the Subscriber follows
	// (kv=, or bind mode).
	followed []bool
	live     []atomic.Bool
	// caps is each replica's capacity in x, in engine blocks: never below
	// the engine's reported block count.
	caps  []atomic.Int64
	names []string
	log   *slog.Logger
}

// startPrecise builds the precise index over cfg's backends and starts
// the Subscriber (binding cfg.KVEventsBind at once). capacity is each
// replica's starting capacity in engine blocks; now is the index clock.
func startPrecise(cfg *Config, names []string, capacity int, now func() time.Duration, log *slog.Logger) (*precise, error) {
	n := len(names)
	p := &precise{
		x:        residency.New(residency.Config{MaxReplicas: max(n, 1), DefaultCapacity: capacity}),
		overlay:  residency.New(residency.Config{MaxReplicas: max(n, 1), TTL: overlayTTL}),
		followed: make([]bool, n),
		live:     make([]atomic.Bool, n),
		caps:     make([]atomic.Int64, n),
		names:    names,
		log:      log,
	}
	var reps []kvevents.Replica
	for i, b := range cfg.Backends {
		p.x.AddReplica(i, capacity)
		p.caps[i].Store(int64(capacity))
		r := kvevents.Replica{ID: i, Model: b.Model, Endpoint: b.KV, Replay: b.Replay}
		if u, err := url.Parse(b.URL); err == nil {
			r.Addr = u.Host
		}
		if r.Endpoint == "" && cfg.KVEventsBind == "" {
			continue // not followed: approximate tracking only
		}
		p.followed[i] = true
		reps = append(reps, r)
	}
	sub, err := kvevents.Start(kvevents.Config{
		Index: p.x, Replicas: reps, Bind: cfg.KVEventsBind, Now: now, Logger: log,
	})
	if err != nil {
		return nil, fmt.Errorf("kv events: %w", err)
	}
	p.sub = sub
	for i, name := range names {
		if !p.followed[i] {
			log.Warn("kv events: replica has no kv= endpoint and no --kv-events-bind; approximate tracking only", "replica", name)
		}
	}
	return p, nil
}

// match overwrites match and age for live replicas with their precise
// match merged with the overlay's (the longer run wins: both hold a
// prefix of the request's chain), and age zero: the engine's events say
// what is resident, so a precise match does not decay with age (as in
// sim). sc keeps the precise match for touch.
func (p *precise) match(hashes []prefix.Hash, now time.Duration, sc *matchScratch, match []int, age []time.Duration) {
	n := len(match)
	sc.pm, sc.om = grow(sc.pm, n), grow(sc.om, n)
	p.x.Match(hashes, now, sc.pm, nil)
	p.overlay.Match(hashes, now, sc.om, nil)
	for i := range match {
		if !p.live[i].Load() {
			continue
		}
		match[i] = max(sc.pm[i], sc.om[i])
		if age != nil {
			age[i] = 0
		}
	}
}

// touch puts a live replica's routed blocks in the overlay and, when its
// precise index lacked a full block of them, tells the Subscriber to
// expect events (so a silent stream turns stale).
func (p *precise) touch(i int, hashes []prefix.Hash, now time.Duration, sc *matchScratch) {
	if !p.live[i].Load() || len(hashes) == 0 {
		return
	}
	p.overlay.Touch(i, hashes, now)
	if i < len(sc.pm) && sc.pm[i] < len(hashes) {
		p.sub.Expect(i)
	}
}

// setCapacity raises replica i's precise capacity to the engine's block
// count (never lowers it: the Subscriber's blocks are the truth, and a
// capacity below the engine's would evict blocks it holds).
func (p *precise) setCapacity(i, engineBlocks int) {
	for {
		c := p.caps[i].Load()
		if int64(engineBlocks) <= c {
			return
		}
		if p.caps[i].CompareAndSwap(c, int64(engineBlocks)) {
			p.x.SetCapacity(i, engineBlocks)
			return
		}
	}
}

// watch switches each followed replica between precise and approximate
// matching as its stream's health changes, logging every transition,
// until ctx is done; then it closes the Subscriber.
func (p *precise) watch(ctx context.Context) {
	defer p.sub.Close()
	t := time.NewTicker(watchInterval)
	defer t.Stop()
	for {
		p.check()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// check reads every followed replica's stream health once.
func (p *precise) check() {
	for i, f := range p.followed {
		if !f {
			continue
		}
		st, _ := p.sub.Status(i)
		h := st.Healthy()
		if p.live[i].Swap(h) == h {
			continue
		}
		args := []any{"replica", p.names[i], "connected", st.Connected, "stale", st.Stale,
			"gaps", st.Gaps, "replays", st.Replays, "resets", st.Resets, "blocks", st.Blocks}
		if h {
			p.log.Info("kv events healthy: replica matched against the precise index", args...)
		} else {
			p.log.Warn("kv events missing or stale: replica falls back to approximate tracking", args...)
		}
	}
}

// KVEventsView is one replica's KV-event stream in a View.
type KVEventsView struct {
	// Followed is true when the router subscribes to the replica's events
	// (kv= or --kv-events-bind).
	Followed bool
	// Connected is true while the stream is connected; Stale when the
	// router expected events that did not come.
	Connected, Stale bool
	// Fallback is true when the replica is matched against the
	// approximate index (its stream is not healthy, or not followed).
	Fallback bool
	// LastEventAge is the time since the last event batch; -1 before the
	// first.
	LastEventAge time.Duration
	// Events, Gaps, Replays, Resets, Orphans and DecodeErrors are
	// kvevents.Status's counters.
	Events, Gaps, Replays, Resets, Orphans, DecodeErrors uint64
	// Blocks is the engine blocks the replica's event stream says it holds.
	Blocks int
}

// view returns replica i's stream view at now.
func (p *precise) view(i int, now time.Time) *KVEventsView {
	v := &KVEventsView{Followed: p.followed[i], Fallback: !p.live[i].Load(), LastEventAge: -1}
	st, ok := p.sub.Status(i)
	if !ok {
		return v
	}
	v.Connected, v.Stale = st.Connected, st.Stale
	if !st.LastEvent.IsZero() {
		v.LastEventAge = now.Sub(st.LastEvent)
	}
	v.Events, v.Gaps, v.Replays, v.Resets, v.Orphans, v.DecodeErrors = st.Events, st.Gaps, st.Replays, st.Resets, st.Orphans, st.DecodeErrors
	v.Blocks = st.Blocks
	return v
}

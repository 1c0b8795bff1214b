package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/view"
)

// watchInterval is how often each replica's event-stream health is read
// to switch it between precise and approximate matching.
const watchInterval = 50 * time.Millisecond

// precise is the router's KV-event feed: the kvevents Subscriber writing
// the fleet tracker's precise index, and the loop that follows each
// replica's stream health (the tracker matches a replica against the
// precise index only while its stream is healthy) and block size.
type precise struct {
	bes *backendSet // replica base URLs
	log *slog.Logger
	fl  *fleet.Fleet
	sub *kvevents.Subscriber // the backends given at start
	// added are the Subscribers of backends added later with a kv=
	// endpoint, by slot (precisemembers.go).
	added []atomic.Pointer[kvevents.Subscriber]
	// startOne starts a Subscriber for one added backend, with the
	// router's KV-event settings.
	startOne func(kvevents.Replica) (*kvevents.Subscriber, error)
	// followed is true, by slot, for replicas whose events the Subscriber
	// follows (kv=, or bind mode): backends given at start, until removed.
	followed []atomic.Bool
}

// startPrecise starts the Subscriber over cfg's backends, named names
// (binding Config.KVEventsBind at once), into fl's tracker; now and start
// are the router's clock and its reading at the start.
func startPrecise(cfg *Config, bes *backendSet, fl *fleet.Fleet, log *slog.Logger, now func() time.Time, start time.Time) (*precise, error) {
	p := &precise{bes: bes, log: log, fl: fl, followed: make([]atomic.Bool, cfg.maxBackends()),
		added: make([]atomic.Pointer[kvevents.Subscriber], cfg.maxBackends())}
	var reps []kvevents.Replica
	for i, b := range cfg.Backends {
		r := kvevents.Replica{ID: i, Endpoint: b.KV, Replay: b.Replay}
		if len(b.Models) > 0 {
			r.Model = b.Models[0]
		}
		if u, err := url.Parse(b.URL); err == nil {
			r.Addr = u.Host
		}
		if r.Endpoint == "" && cfg.KVEventsBind == "" {
			log.Warn("kv events: replica has no kv= endpoint and no --kv-events-bind; approximate tracking only", "replica", b.URL)
			continue
		}
		p.followed[i].Store(true)
		reps = append(reps, r)
	}
	kc := kvevents.Config{
		Index: fl.Tracker().Precise(), Offloaded: fl.Tracker().Offloaded(), Replicas: reps, Bind: cfg.KVEventsBind,
		Now: func() time.Duration { return now().Sub(start) }, Logger: log, Limits: cfg.KVEvents,
	}
	sub, err := kvevents.Start(kc)
	if err != nil {
		return nil, fmt.Errorf("kv events: %w", err)
	}
	p.startOne = func(r kvevents.Replica) (*kvevents.Subscriber, error) {
		one := kc
		one.Replicas, one.Bind = []kvevents.Replica{r}, ""
		return kvevents.Start(one)
	}
	p.sub = sub
	fl.Tracker().SetFeed(feedOf{p})
	return p, nil
}

// watch follows every replica's stream until ctx is done, then closes the
// Subscriber.
func (p *precise) watch(ctx context.Context) {
	defer p.closeAll()
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

// check reads every followed replica's stream once: its health switches
// it between precise and approximate matching (each transition logged),
// the block size of its events is the replica's.
func (p *precise) check() {
	p.fl.Tracker().Poll(func(i int, live bool) {
		st, _ := p.subOf(i).Status(i)
		args := []any{"replica", p.bes.at(i).cfg.URL, "connected", st.Connected, "stale", st.Stale,
			"gaps", st.Gaps, "replays", st.Replays, "resets", st.Resets, "blocks", st.Blocks}
		if live {
			p.log.Info("kv events healthy: replica matched against the precise index", args...)
		} else {
			p.log.Warn("kv events missing or stale: replica falls back to approximate tracking", args...)
		}
	})
	for i := range p.followed {
		if !p.followed[i].Load() {
			continue
		}
		if st, ok := p.subOf(i).Status(i); ok && st.BlockSize > 0 {
			p.fl.SetBlockSize(p.bes.at(i).cfg.URL, st.BlockSize)
		}
	}
}

// view returns replica i's stream at now.
func (p *precise) view(i int, now time.Time) *view.Events {
	v := &view.Events{Followed: i >= 0 && i < len(p.followed) && p.followed[i].Load(), Fallback: !p.fl.Tracker().Live(i), LastEvent: -1}
	st, ok := p.subOf(i).Status(i)
	if !ok {
		return v
	}
	v.Connected, v.Stale = st.Connected, st.Stale
	if !st.LastEvent.IsZero() {
		v.LastEvent = now.Sub(st.LastEvent)
	}
	v.Events, v.Gaps, v.Replays, v.Resets, v.Orphans, v.DecodeErrors = st.Events, st.Gaps, st.Replays, st.Resets, st.Orphans, st.DecodeErrors
	v.Blocks = st.Blocks
	return v
}

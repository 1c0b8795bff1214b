package sim

import (
	"fmt"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvrouter/kvrouter/fleet"
)

// Defaults of the multi-router fields of Config.
const (
	// DefaultSyncInterval is how often N simulated routers exchange their
	// shares when Config.SyncInterval is zero (the live --sync-interval's
	// default).
	DefaultSyncInterval = 50 * time.Millisecond
	// AssignRoundRobin gives request k to router k mod N (Config.Assign):
	// a conversation's turns go to different routers.
	AssignRoundRobin = "round-robin"
	// AssignHash gives a request to the router its session (else its id)
	// hashes to, as a load balancer with session affinity would.
	AssignHash = "hash"
	// MaxRouters bounds Config.Routers.
	MaxRouters = 64
)

// routers are the simulated routers beyond the first (runner.fl): each a
// fleet of its own, the same code the live router runs, over the same
// engines. Every one of them gets every scrape, health change and KV
// event; a request is decided by one (assign); every SyncInterval of
// virtual time, each exports its share and merges the others' (onSync),
// as the live routers do through Redis (package peers) with the same
// fleet.Export and fleet.Merge. A share is seen one interval after the
// decisions it reports at most; the live routers' bound is about twice
// that (publish, then read, each on its own tick).
//
// Sharing routers also share their session bindings on the request path,
// as the live ones do through Redis (proxy's readSession, writeSession):
// each decision writes its session's binding to sessions at once, and a
// router reads it before deciding on the session (fleet.BindPeer), so a
// conversation whose turns alternate between routers faster than the sync
// stays on its replica.
type routers struct {
	more []*fleet.Fleet
	scs  []fleet.Scratch // the decisions' buffers, one per router in more
	buf  []fleet.Share
	// sessions is the shared store of session bindings, by session id
	// (nil: the routers do not share).
	sessions map[string]fleet.PeerSession
}

// routerName is router k's id among its peers (Share.Router).
func routerName(k int) string { return fmt.Sprint("router-", k) }

// readSession gives router k's fleet fl the binding another router wrote
// for job j's session (r.freq), as the live router reads it from Redis.
func (r *runner) readSession(j, k int, fl *fleet.Fleet) {
	jb := &r.jobs[j]
	if r.rs.sessions == nil || jb.session == "" {
		return
	}
	if p, ok := r.rs.sessions[jb.session]; ok && p.Router != routerName(k) {
		fl.BindPeer(&r.freq, p, at(r.now))
	}
}

// writeSession writes router k's binding of job j's session to replica
// i, as the live router writes it to Redis when it decides.
func (r *runner) writeSession(j, k, i int) {
	jb := &r.jobs[j]
	if r.rs.sessions == nil || jb.session == "" {
		return
	}
	r.rs.sessions[jb.session] = fleet.SessionOf(routerName(k), r.reps[i].id, at(r.now), jb.hashes)
}

// checkRouters validates and fills the multi-router fields of c.
func (c *Config) checkRouters() error {
	if c.Routers == 0 {
		c.Routers = 1
	}
	if c.Routers < 1 || c.Routers > MaxRouters {
		return fmt.Errorf("sim: %d routers: want 1 to %d", c.Routers, MaxRouters)
	}
	if c.SyncInterval == 0 {
		c.SyncInterval = DefaultSyncInterval
	}
	switch c.Assign {
	case "":
		c.Assign = AssignRoundRobin
	case AssignRoundRobin, AssignHash:
	default:
		return fmt.Errorf("sim: assign %q: want %s or %s", c.Assign, AssignRoundRobin, AssignHash)
	}
	return nil
}

// addRouters builds the routers beyond the first, each a fleet of fc.
func (r *runner) addRouters(fc fleet.Config) error {
	if r.cfg.Routers <= 1 {
		return nil
	}
	r.fl.SharePeers(0)
	for range r.cfg.Routers - 1 {
		f, err := fleet.New(fc)
		if err != nil {
			return err
		}
		f.SharePeers(0)
		r.rs.more = append(r.rs.more, f)
	}
	r.rs.scs = make([]fleet.Scratch, len(r.rs.more))
	if r.cfg.SyncInterval > 0 {
		r.rs.sessions = make(map[string]fleet.PeerSession)
	}
	return nil
}

// each calls fn with every router's fleet, the first first.
func (r *runner) each(fn func(*fleet.Fleet)) {
	fn(r.fl)
	for _, f := range r.rs.more {
		fn(f)
	}
}

// router returns the fleet that decides job j, its buffers and its
// index.
func (r *runner) router(j int) (*fleet.Fleet, *fleet.Scratch, int) {
	n := len(r.rs.more) + 1
	if n == 1 {
		return r.fl, &r.sc, 0
	}
	k := j % n
	if r.cfg.Assign == AssignHash {
		jb := &r.jobs[j]
		h := jb.hash
		if jb.session != "" {
			h = xxhash.Sum64String(jb.session)
		}
		k = int(h % uint64(n))
	}
	if k == 0 {
		return r.fl, &r.sc, 0
	}
	return r.rs.more[k-1], &r.rs.scs[k-1], k
}

// onSync exchanges the routers' shares: each exports, then each merges
// everyone else's; the next exchange is queued while anything is still
// to happen.
func (r *runner) onSync() {
	n := len(r.rs.more) + 1
	now := at(r.now)
	shares := r.rs.buf[:0]
	r.each(func(f *fleet.Fleet) {
		sh := f.Export(now)
		sh.Router = routerName(len(shares))
		shares = append(shares, sh)
	})
	others := make([]fleet.Share, 0, n-1)
	k := 0
	r.each(func(f *fleet.Fleet) {
		others = append(others[:0], shares[:k]...)
		others = append(others, shares[k+1:]...)
		f.Merge(now, others)
		k++
	})
	r.rs.buf = shares[:0]
	if r.busy() {
		r.q.push(event{at: r.now + r.cfg.SyncInterval, kind: evSync})
	}
}

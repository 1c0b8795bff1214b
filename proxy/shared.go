package proxy

import (
	"context"
	"errors"
	"time"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/peers"
	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/route"
)

// Several routers as one (package peers): the request path's side of the
// shared session bindings, and the admin changes shared through Redis.
// Without Config.Peers.URL none of this runs.

// SourceShared names membership changes applied from the shared state
// (another router's admin change, or the membership a router loads at
// start).
const SourceShared = "shared"

// readSession reads the call's session binding from Redis before the
// decision, waiting at most peers.Settings.ReadTimeout, and takes it when
// it is newer than this router's (another router routed the previous
// turn within the sync interval): the session and the blocks of the
// prompt it was bound with, on its replica.
func (c *call) readSession() {
	rt := c.rt
	if rt.shared == nil || c.session == "" {
		return
	}
	if p, ok := rt.shared.ReadSession(c.ctx, fleet.SessionKey(c.session)); ok {
		rt.st.fleet.BindPeer(&c.freq, p, rt.now())
	}
}

// writeSession writes the session's binding to the call's replica to
// Redis, in the background (a retry's after the first attempt's: the
// syncer's writer keeps their order), waited for, bounded, before the
// answer ends (waitSession).
func (c *call) writeSession() {
	rt := c.rt
	if rt.shared == nil || c.session == "" || c.replica < 0 {
		return
	}
	var chain []prefix.Hash
	if len(c.freq.Chains) > 0 {
		chain = c.freq.Chains[0].Hashes
	}
	p := fleet.SessionOf(rt.shared.Router(), rt.name(c.replica), c.sent, chain)
	c.published = rt.shared.WriteSession(fleet.SessionKey(c.session), p, rt.cfg.SessionTTL)
}

// waitSession waits for the binding's write, so that the session's next
// turn finds it at any router, but no longer than the syncer's WriteWait
// (--shared-read-timeout): with Redis slow or stalled, the write goes on
// off the request path (bounded by the syncer's timeout) and the next turn
// may reach a router that does not know the binding yet.
func (c *call) waitSession() {
	if c.published == nil {
		return
	}
	t := time.NewTimer(c.rt.shared.WriteWait())
	defer t.Stop()
	select {
	case <-c.published:
	case <-t.C:
	}
	c.published = nil
}

// shareMember writes an admin change of backend id (op: add, drain,
// undrain, remove) to the shared membership, for the other routers and
// for this one's restart.
func (rt *Router) shareMember(op, id string) {
	if rt.shared == nil {
		return
	}
	m := peers.Member{URL: id, State: peers.MemberServing}
	switch op {
	case "remove":
		m.State = peers.MemberRemoved
	case "drain":
		m.State = peers.MemberDraining
	}
	if m.State != peers.MemberRemoved {
		if i := rt.st.fleet.At(id); i >= 0 {
			b := rt.st.bes.at(i).cfg
			m.KV, m.Replay, m.Models = b.KV, b.Replay, b.Models
			if b.Role != route.RoleBoth {
				m.Role = b.Role.String()
			}
		}
		if m.State == peers.MemberServing && rt.draining(id) {
			m.State = peers.MemberDraining
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := rt.shared.PublishMember(ctx, m); err != nil {
		rt.log.Warn("admin change not shared yet", "op", op, "backend", id, "err", err)
	}
}

// draining reports whether backend id is listed as draining.
func (rt *Router) draining(id string) bool {
	for _, b := range rt.Backends() {
		if b.URL == id {
			return b.State == fleet.StateDraining
		}
	}
	return false
}

// applyMembers makes this router's backends the shared membership ms:
// removed ones removed, others added (again, when their options
// changed), drained or returned to service. Backends ms does not name
// are left as they are. It runs on the syncer's goroutine.
func (rt *Router) applyMembers(ms []peers.Member) error {
	state := map[string]string{}
	for _, b := range rt.Backends() {
		state[b.URL] = b.State
	}
	var errs []error
	for _, m := range ms {
		if err := rt.applyMember(m, state[m.URL]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// applyMember applies one shared entry to backend m.URL, whose local state
// is have ("" when not a backend here).
func (rt *Router) applyMember(m peers.Member, have string) error {
	if m.State == peers.MemberRemoved {
		if have == "" || have == fleet.StateRemoved {
			return nil
		}
		_, err := rt.RemoveBackend(m.URL, SourceShared)
		return err
	}
	role, err := route.ParseRole(m.Role)
	if err != nil {
		return err
	}
	want := Backend{URL: m.URL, KV: m.KV, Replay: m.Replay, Models: m.Models, Role: role}
	if have != "" && have != fleet.StateRemoved && !sameBackend(rt.st.bes.at(rt.st.fleet.At(m.URL)).cfg, want) {
		if _, err := rt.RemoveBackend(m.URL, SourceShared); err != nil {
			return err
		}
		have = fleet.StateRemoved
	}
	if have == "" || have == fleet.StateRemoved {
		if err := rt.AddBackend(want, SourceShared); err != nil {
			return err
		}
		have = fleet.StateServing
	}
	switch {
	case m.State == peers.MemberDraining && have != fleet.StateDraining:
		return rt.DrainBackend(m.URL, SourceShared)
	case m.State == peers.MemberServing && have == fleet.StateDraining:
		return rt.UndrainBackend(m.URL, SourceShared)
	}
	return nil
}

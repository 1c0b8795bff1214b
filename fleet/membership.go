package fleet

import (
	"errors"
	"fmt"

	"github.com/kvrouter/kvrouter/route"
)

// A replica's membership (replica.member). A draining replica keeps its
// slot, its index entries and its requests in flight, but is no candidate
// for new ones: snapshots show it unhealthy, so the policy never picks it
// and a session pinned to it moves on. A removed replica is gone from the
// fleet (its id can be added again), its residency entries and sessions
// dropped; its requests in flight still hold it (their Tickets release
// its counts), and its slot is only reused by a later AddReplica once
// they have all finished, so that an index a request in flight holds
// never changes owner.
const (
	memberServing int32 = iota
	memberDraining
	memberRemoved
)

// ErrFull is returned by AddReplica when every one of Config.MaxReplicas
// slots is taken (removed replicas with requests in flight hold theirs).
var ErrFull = errors.New("fleet: full")

// Member states, as Members names them.
const (
	StateServing  = "serving"
	StateDraining = "draining"
	// StateRemoved is a removed replica whose requests in flight have not
	// all finished: its slot is not free yet.
	StateRemoved = "removed"
)

// Member is one replica of Members.
type Member struct {
	// ID is the replica's id; Index its slot in the snapshot order.
	ID    string
	Index int
	// State is StateServing, StateDraining or StateRemoved.
	State string
	// Healthy is the health flag (SetHealthy), whatever the state.
	Healthy bool
	// InFlight is the router's requests sent to it and not finished.
	InFlight int
}

// available reports whether r may get new requests: healthy and serving.
func (r *replica) available() bool {
	return r.healthy.Load() && r.member.Load() == memberServing
}

// candidate says a policy may pick the replica (route.Replica.Healthy):
// available, and not a prefill worker.
func (r *replica) candidate() bool {
	return r.role != route.RolePrefill && r.available()
}

// prefillWorker says the replica can take a prefill leg now
// (route.Replica.Prefills): an available prefill worker.
func (r *replica) prefillWorker() bool {
	return r.role == route.RolePrefill && r.available()
}

// Drain stops new requests to replica id (snapshots show it unhealthy;
// sessions pinned to it move on at their next request) and lets those in
// flight finish. Draining a draining replica does nothing.
func (f *Fleet) Drain(id string) error {
	r := f.lookup(id)
	if r == nil {
		return fmt.Errorf("drain %q: %w", id, ErrUnknownReplica)
	}
	if r.member.CompareAndSwap(memberServing, memberDraining) {
		r.changed()
	}
	return nil
}

// Undrain returns a draining replica to service.
func (f *Fleet) Undrain(id string) error {
	r := f.lookup(id)
	if r == nil {
		return fmt.Errorf("undrain %q: %w", id, ErrUnknownReplica)
	}
	if r.member.CompareAndSwap(memberDraining, memberServing) {
		r.changed()
	}
	return nil
}

// RemoveReplica takes replica id out of the fleet at once: no new request
// goes to it, its residency entries, declared models and sessions are
// dropped, its learned scales leave the others' prior. Requests already in
// flight on it finish (their Tickets hold it); its slot is reused once
// they have (see AddReplica). It returns the requests still in flight.
func (f *Fleet) RemoveReplica(id string) (inFlight int, err error) {
	f.mu.Lock()
	r := f.byID[id]
	if r == nil {
		f.mu.Unlock()
		return 0, fmt.Errorf("remove %q: %w", id, ErrUnknownReplica)
	}
	delete(f.byID, id)
	r.member.Store(memberRemoved)
	r.changed()
	f.mu.Unlock()

	f.tr.Clear(r.index)
	f.models.set(r.index, nil, true, true) // declared to serve nothing
	r.mu.Lock()
	r.calShare.set(&f.cal, nil)
	r.dcalShare.set(&f.dcal, nil)
	r.mu.Unlock()
	f.dropSessions(r)
	return int(r.inFlight.Load()), nil
}

// dropSessions unbinds every session bound to r.
func (f *Fleet) dropSessions(r *replica) {
	f.smu.Lock()
	defer f.smu.Unlock()
	for _, s := range f.sessions.byKey {
		if s.r == r {
			f.sessions.remove(s)
		}
	}
}

// freeSlotLocked returns the first slot of a removed replica with nothing
// in flight, or −1; f.mu is held.
func (f *Fleet) freeSlotLocked() int {
	for i, r := range f.reps {
		if r.member.Load() == memberRemoved && r.inFlight.Load() == 0 {
			return i
		}
	}
	return -1
}

// Members returns the replicas in snapshot order with their membership:
// serving and draining ones, and removed ones whose requests in flight
// have not finished yet. Free slots are left out.
func (f *Fleet) Members() []Member {
	f.mu.RLock()
	defer f.mu.RUnlock()
	out := make([]Member, 0, len(f.reps))
	for i, r := range f.reps {
		m := Member{ID: r.id, Index: i, Healthy: r.healthy.Load(), InFlight: int(r.inFlight.Load())}
		switch r.member.Load() {
		case memberServing:
			m.State = StateServing
		case memberDraining:
			m.State = StateDraining
		default:
			if m.InFlight == 0 {
				continue
			}
			m.State = StateRemoved
		}
		out = append(out, m)
	}
	return out
}

// Serving returns how many replicas are in the fleet and not draining,
// healthy or not: zero for an empty fleet (none configured, or none
// discovered yet), which the router answers 503 no_replica rather than
// 404 for a model nobody serves.
func (f *Fleet) Serving() int {
	f.mu.RLock()
	defer f.mu.RUnlock()
	n := 0
	for _, r := range f.reps {
		if r.member.Load() == memberServing {
			n++
		}
	}
	return n
}

// Draining reports whether replica id is draining; false for an unknown
// id.
func (f *Fleet) Draining(id string) bool {
	r := f.lookup(id)
	return r != nil && r.member.Load() == memberDraining
}

// Activity returns a channel that closes when the router next charges a
// request to replica id or releases one from it (nil for an unknown id):
// scrape.Scraper's Activity, so that an idle replica's scrapes back off
// and its traffic brings them back. Each call replaces the channel of the
// one before, which then never closes.
func (f *Fleet) Activity(id string) <-chan struct{} {
	r := f.lookup(id)
	if r == nil {
		return nil
	}
	ch := make(chan struct{})
	r.watch.Store(&ch)
	return ch
}

// moved closes and clears r's Activity channel, if any: at a request
// charged or released. It costs one atomic load when there is none.
func (r *replica) moved() {
	if r.watch.Load() == nil {
		return
	}
	if ch := r.watch.Swap(nil); ch != nil {
		close(*ch)
	}
}

// InFlight returns the requests in flight on replica id (zero for an
// unknown id).
func (f *Fleet) InFlight(id string) int {
	if r := f.lookup(id); r != nil {
		return int(r.inFlight.Load())
	}
	return 0
}

package fleet

import (
	"time"

	"kvrouter/route"
)

// session is one conversation's binding.
type session struct {
	r    *replica
	last time.Time // last Bind
}

// sessionTTL is the idle expiry.
func (f *Fleet) sessionTTL() time.Duration {
	if f.cfg.SessionTTL > 0 {
		return f.cfg.SessionTTL
	}
	return DefaultSessionTTL
}

// Bind binds session to replica id (re-binding it if it was elsewhere) and
// marks it used now. Empty sessions and unknown ids are ignored. Expired
// sessions are swept here, at most twice per SessionTTL, in one pass.
func (f *Fleet) Bind(sessionID, id string) {
	if sessionID == "" {
		return
	}
	r := f.lookup(id)
	if r == nil {
		return
	}
	now := time.Now()
	f.smu.Lock()
	defer f.smu.Unlock()
	if s, ok := f.sessions[sessionID]; ok {
		s.r, s.last = r, now
	} else {
		f.sessions[sessionID] = &session{r: r, last: now}
	}
	if now.Sub(f.lastSweep) > f.sessionTTL()/2 {
		f.sweepLocked(now)
	}
}

// sweepLocked drops every expired session; smu is held.
func (f *Fleet) sweepLocked(now time.Time) {
	ttl := f.sessionTTL()
	for k, s := range f.sessions {
		if now.Sub(s.last) > ttl {
			delete(f.sessions, k)
		}
	}
	f.lastSweep = now
}

// PinID returns the replica session is bound to. ok is false when the
// session is unknown, has been idle longer than SessionTTL (it is then
// dropped), or its replica is unhealthy or removed: the caller routes
// afresh and Commit re-binds the session to the new replica.
func (f *Fleet) PinID(sessionID string) (id string, ok bool) {
	if sessionID == "" {
		return "", false
	}
	now := time.Now()
	f.smu.Lock()
	defer f.smu.Unlock()
	s, ok := f.sessions[sessionID]
	if !ok {
		return "", false
	}
	if now.Sub(s.last) > f.sessionTTL() {
		delete(f.sessions, sessionID)
		return "", false
	}
	if !s.r.healthy.Load() {
		return "", false
	}
	return s.r.id, true
}

// Pin returns the index in s of the replica session is bound to, for
// route.Request.Pinned, or −1 (see PinID). s is a snapshot taken from this
// fleet.
func (f *Fleet) Pin(sessionID string, s *route.Snapshot) int {
	id, ok := f.PinID(sessionID)
	if !ok {
		return -1
	}
	i := -1
	f.mu.RLock()
	if r := f.byID[id]; r != nil {
		i = r.index
	}
	f.mu.RUnlock()
	if i >= 0 && i < len(s.Replicas) && s.Replicas[i].ID == id {
		return i
	}
	for i := range s.Replicas { // the fleet changed since s was taken
		if s.Replicas[i].ID == id {
			return i
		}
	}
	return -1
}

// Unbind forgets a session.
func (f *Fleet) Unbind(sessionID string) {
	f.smu.Lock()
	defer f.smu.Unlock()
	delete(f.sessions, sessionID)
}

// Sessions returns the number of bound sessions (expired ones not yet swept
// included).
func (f *Fleet) Sessions() int {
	f.smu.Lock()
	defer f.smu.Unlock()
	return len(f.sessions)
}

// unbindReplica drops every session bound to r.
func (f *Fleet) unbindReplica(r *replica) {
	f.smu.Lock()
	defer f.smu.Unlock()
	for k, s := range f.sessions {
		if s.r == r {
			delete(f.sessions, k)
		}
	}
}

// sessionCounts returns the bound sessions per replica.
func (f *Fleet) sessionCounts() map[*replica]int {
	f.smu.Lock()
	defer f.smu.Unlock()
	n := make(map[*replica]int)
	for _, s := range f.sessions {
		n[s.r]++
	}
	return n
}

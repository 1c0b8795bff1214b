package fleet

import (
	"time"

	"github.com/cespare/xxhash/v2"

	"kvrouter/route"
)

// session is one conversation's binding.
type session struct {
	r    *replica
	last time.Time // last bind
}

// sessionHash is route.Request.Session of a session id: a hash, never
// zero, or zero for none.
func sessionHash(id string) uint64 {
	if id == "" {
		return 0
	}
	return xxhash.Sum64String(id) | 1
}

// bind binds session to r (re-binding it if it was elsewhere) and marks it
// used at now. Expired sessions are swept here, at most twice per
// SessionTTL, in one pass.
func (f *Fleet) bind(sessionID string, r *replica, now time.Time) {
	f.smu.Lock()
	defer f.smu.Unlock()
	if s, ok := f.sessions[sessionID]; ok {
		s.r, s.last = r, now
	} else {
		f.sessions[sessionID] = &session{r: r, last: now}
	}
	if now.Sub(f.lastSweep) > f.cfg.SessionTTL/2 {
		f.sweepLocked(now)
	}
}

// sweepLocked drops every expired session; smu is held.
func (f *Fleet) sweepLocked(now time.Time) {
	for k, s := range f.sessions {
		if now.Sub(s.last) > f.cfg.SessionTTL {
			delete(f.sessions, k)
		}
	}
	f.lastSweep = now
}

// pin returns the index in s of the replica session is bound to, for
// route.Request.Pinned, or −1: when the session is unknown, has been idle
// longer than SessionTTL at now (it is then dropped), or its replica is
// not a candidate in s (unhealthy, or not serving the model). The policy
// then routes afresh and commit re-binds the session.
func (f *Fleet) pin(sessionID string, s *route.Snapshot, now time.Time) int {
	if sessionID == "" {
		return -1
	}
	f.smu.Lock()
	defer f.smu.Unlock()
	ss, ok := f.sessions[sessionID]
	if !ok {
		return -1
	}
	if now.Sub(ss.last) > f.cfg.SessionTTL {
		delete(f.sessions, sessionID)
		return -1
	}
	i := ss.r.index
	if i < 0 || i >= len(s.Replicas) || !s.Replicas[i].Healthy {
		return -1
	}
	return i
}

// Sessions returns the number of bound sessions (expired ones not yet
// swept included).
func (f *Fleet) Sessions() int {
	f.smu.Lock()
	defer f.smu.Unlock()
	return len(f.sessions)
}

// sessionCounts returns the bound sessions per replica index.
func (f *Fleet) sessionCounts(n int) []int {
	f.smu.Lock()
	defer f.smu.Unlock()
	counts := make([]int, n)
	for _, s := range f.sessions {
		if s.r.index < n {
			counts[s.r.index]++
		}
	}
	return counts
}

package fleet

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
)

// Sessions are the settings of session binding, with kvrouter serve's
// YAML keys.
type Sessions struct {
	// SessionTTL is how long an idle session stays bound to its replica;
	// zero means DefaultSessionTTL.
	SessionTTL time.Duration `yaml:"session-ttl"`
	// MaxSessions is the most sessions bound at once, the least recently
	// bound dropped past it; zero means DefaultMaxSessions. Session ids
	// longer than MaxSessionIDBytes are kept as a hash.
	MaxSessions int `yaml:"max-sessions"`
}

// Validate reports a negative setting.
func (s Sessions) Validate() error {
	if s.SessionTTL < 0 || s.MaxSessions < 0 {
		return fmt.Errorf("session-ttl, max-sessions: must not be negative, got %s, %d", s.SessionTTL, s.MaxSessions)
	}
	return nil
}

// Bounds of the session table.
const (
	// DefaultMaxSessions is how many sessions stay bound when
	// Config.MaxSessions is zero: about 20 MB of table at most.
	DefaultMaxSessions = 100_000
	// MaxSessionIDBytes is the longest session id kept as it is; a longer
	// one is keyed by its hash (SessionKey), so that a client's id costs at
	// most this much memory however long it is.
	MaxSessionIDBytes = 64
)

// SessionKey returns the key a session id is bound under: the id itself
// up to MaxSessionIDBytes, else "sha256:" and 22 characters of base64
// (the first 128 bits of its SHA-256), a fixed size, collision-resistant
// so that one client cannot take over another's session by choosing an
// id.
func SessionKey(id string) string {
	if len(id) <= MaxSessionIDBytes {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return "sha256:" + base64.RawURLEncoding.EncodeToString(sum[:16])
}

// session is one conversation's binding, an element of its table's
// recency list.
type session struct {
	key  string
	r    *replica
	last time.Time // last bind
	// blocks and tail are the full blocks of the last request's prompt
	// and the hash of its last one, in its first chain: the next request
	// extends that prompt when its own chain has tail there (extends).
	// blocks is zero when unknown (a peer's binding).
	blocks     int
	tail       prefix.Hash
	prev, next *session // toward the most, the least recently bound
}

// sessionTable is the bound sessions: a map by key and a list by recency
// of binding (every bind moves its session to the front), so that the
// least recently bound is evicted first when the table is full and the
// expired ones are swept from the back. The zero value is not usable: see
// newSessionTable. Fleet.smu guards it.
type sessionTable struct {
	byKey map[string]*session
	// head and tail are the most and least recently bound; nil when empty.
	head, tail *session
	max        int
	evicted    int64 // sessions dropped to make room, in all
}

func newSessionTable(max int) sessionTable {
	if max <= 0 {
		max = DefaultMaxSessions
	}
	return sessionTable{byKey: make(map[string]*session), max: max}
}

// unlink takes s out of the recency list.
func (t *sessionTable) unlink(s *session) {
	if s.prev != nil {
		s.prev.next = s.next
	} else {
		t.head = s.next
	}
	if s.next != nil {
		s.next.prev = s.prev
	} else {
		t.tail = s.prev
	}
	s.prev, s.next = nil, nil
}

// pushFront makes s the most recently bound.
func (t *sessionTable) pushFront(s *session) {
	s.next = t.head
	if t.head != nil {
		t.head.prev = s
	}
	t.head = s
	if t.tail == nil {
		t.tail = s
	}
}

// remove drops s.
func (t *sessionTable) remove(s *session) {
	t.unlink(s)
	delete(t.byKey, s.key)
}

// bind binds key to r at now, as the most recently bound, evicting the
// least recently bound session if the table is full, and returns it.
func (t *sessionTable) bind(key string, r *replica, now time.Time) *session {
	if s, ok := t.byKey[key]; ok {
		s.r, s.last = r, now
		t.unlink(s)
		t.pushFront(s)
		return s
	}
	if len(t.byKey) >= t.max {
		t.remove(t.tail)
		t.evicted++
	}
	s := &session{key: key, r: r, last: now}
	t.byKey[key] = s
	t.pushFront(s)
	return s
}

// prompt records chain, the block hashes of the request just bound, as
// the prompt the session's next request may extend.
func (s *session) prompt(chain []prefix.Hash) {
	s.blocks, s.tail = len(chain), 0
	if len(chain) > 0 {
		s.tail = chain[len(chain)-1]
	}
}

// extends reports whether a request whose first chain is chain extends
// the session's last prompt, and whether that is known.
func (s *session) extends(chain []prefix.Hash) (yes, known bool) {
	if s.blocks == 0 {
		return false, false
	}
	return len(chain) >= s.blocks && chain[s.blocks-1] == s.tail, true
}

// sweep drops the sessions bound longer than ttl before now, from the
// back of the list, where the oldest are.
func (t *sessionTable) sweep(now time.Time, ttl time.Duration) {
	for t.tail != nil && now.Sub(t.tail.last) > ttl {
		t.remove(t.tail)
	}
}

// sessionHash is route.Request.Session of a session id: a hash, never
// zero, or zero for none.
func sessionHash(id string) uint64 {
	if id == "" {
		return 0
	}
	return xxhash.Sum64String(id) | 1
}

// bind binds session to r (re-binding it if it was elsewhere), marks it
// used at now and records chain, its request's block hashes (nil: none). Expired sessions are swept here, at most twice per
// SessionTTL, from the least recently bound; past Config.MaxSessions the
// least recently bound is dropped.
func (f *Fleet) bind(sessionID string, r *replica, now time.Time, chain []prefix.Hash) {
	key := SessionKey(sessionID)
	f.smu.Lock()
	defer f.smu.Unlock()
	f.sessions.bind(key, r, now).prompt(chain)
	if now.Sub(f.lastSweep) > f.cfg.SessionTTL/2 {
		f.sessions.sweep(now, f.cfg.SessionTTL)
		f.lastSweep = now
	}
}

// pin returns the index in s of the replica session is bound to, for
// route.Request.Pinned, or −1: when the session is unknown, has been idle
// longer than SessionTTL at now (it is then dropped), or its replica is
// not a candidate in s (unhealthy, or not serving the model). The policy
// then routes afresh and commit re-binds the session. It also counts the
// request, whose first chain is chain, in the fleet's turnTally and
// returns the requests expected to follow it (route.Request.FutureTurns).
func (f *Fleet) pin(sessionID string, chain []prefix.Hash, s *route.Snapshot, now time.Time) (int, float64) {
	i, turns, seen := f.pinPending(sessionID, chain, s, now)
	f.countTurn(seen)
	return i, turns
}

// pinPending is pin without counting the request in the turnTally: it
// returns the requests expected to follow it as if it were counted, and
// what counting it adds (countTurn), which commit does once the
// decision is committed, so that a decision admission refuses counts
// nothing.
func (f *Fleet) pinPending(sessionID string, chain []prefix.Hash, s *route.Snapshot, now time.Time) (int, float64, turnSeen) {
	if sessionID == "" {
		return -1, 0, turnNone
	}
	key := SessionKey(sessionID)
	f.smu.Lock()
	defer f.smu.Unlock()
	ss, ok := f.sessions.byKey[key]
	if ok && (now.Sub(ss.last) > f.cfg.SessionTTL || ss.r.member.Load() == memberRemoved) {
		f.sessions.remove(ss)
		ok = false
	}
	if !ok {
		return -1, f.turns.peek(false), turnNew
	}
	extends, known := ss.extends(chain)
	turns, seen := f.turns.expected(), turnNone
	if known {
		turns, seen = f.turns.peek(extends), turnNew
		if extends {
			seen = turnExtends
		}
	}
	if i := ss.r.index; i >= 0 && i < len(s.Replicas) && s.Replicas[i].Healthy {
		return i, turns, seen
	}
	return -1, turns, seen
}

// turnSeen is what a request adds to the turnTally: nothing, a request,
// or a request that extended its session's last prompt.
type turnSeen uint8

const (
	turnNone turnSeen = iota
	turnNew
	turnExtends
)

// countTurn counts what pinPending saw of a committed request.
func (f *Fleet) countTurn(seen turnSeen) {
	if seen == turnNone {
		return
	}
	f.smu.Lock()
	f.turns.next(seen == turnExtends)
	f.smu.Unlock()
}

// turnTally estimates how many requests follow a request with a session
// to the replica it goes to: those that extend its prompt (a
// conversation's next turns), which find their context cached there. Of
// the n requests with a session counted, e extended their session's
// last prompt; so a request is followed by an extension with
// probability p = e/n, and, taking each as the next one's chance again
// (a geometric length, the same expectation at every turn), by p/(1 − p)
// = e/(n − e) of them. A session whose requests share only a prefix of
// their prompts (a group's context, then each a new question) is
// followed by none: its next request goes wherever that prefix is. The
// counts decay so that about the last turnMemory requests weigh.
// Fleet.smu guards it.
type turnTally struct{ requests, extended float64 }

// turnMemory is the requests with a session a turnTally remembers, about.
const turnMemory = 1000

// next counts one request with a session, which extended its session's
// last prompt or not, and returns expected.
func (t *turnTally) next(extended bool) float64 {
	t.requests = t.requests*(1-1.0/turnMemory) + 1
	t.extended *= 1 - 1.0/turnMemory
	if extended {
		t.extended++
	}
	return t.expected()
}

// peek is what next would return, counting nothing.
func (t turnTally) peek(extended bool) float64 { return t.next(extended) }

// expected is the requests expected to follow one, e/(n − e).
func (t *turnTally) expected() float64 {
	return t.extended / max(t.requests-t.extended, 1)
}

// Sessions returns the number of bound sessions (expired ones not yet
// swept included).
func (f *Fleet) Sessions() int {
	f.smu.Lock()
	defer f.smu.Unlock()
	return len(f.sessions.byKey)
}

// SessionsEvicted returns how many sessions were dropped, in all, to keep
// the table within Config.MaxSessions (expired ones not counted).
func (f *Fleet) SessionsEvicted() int64 {
	f.smu.Lock()
	defer f.smu.Unlock()
	return f.sessions.evicted
}

// sessionCounts returns the bound sessions per replica index.
func (f *Fleet) sessionCounts(n int) []int {
	f.smu.Lock()
	defer f.smu.Unlock()
	counts := make([]int, n)
	for _, s := range f.sessions.byKey {
		if s.r.index < n {
			counts[s.r.index]++
		}
	}
	return counts
}

// PeerSession is a session's binding as a router shares it on the
// request path (package peers): the replica, when it was bound and by
// which router (its id among its peers, Share.Router; empty: unknown),
// and the full blocks of the prompt of the request bound (its first
// chain's) with the last one's hash.
type PeerSession struct {
	Replica string
	Router  string
	At      time.Time
	Blocks  int
	Tail    prefix.Hash
}

// SessionOf returns session id's binding as PeerSession, for a request
// whose first chain is chain just bound to it by router (Blocks and Tail
// of that chain).
func SessionOf(router, replica string, at time.Time, chain []prefix.Hash) PeerSession {
	p := PeerSession{Replica: replica, Router: router, At: at, Blocks: len(chain)}
	if len(chain) > 0 {
		p.Tail = chain[len(chain)-1]
	}
	return p
}

// BindPeer takes another router's binding of r's session, p, unless the
// session is bound here at p.At or later, or p.Replica is unknown here:
// the session is bound to p.Replica, and, when r extends the prompt p was
// bound with, that prompt's blocks enter the index on p.Replica, as the
// peer's routed blocks would a sync round later. It reports whether it
// took p. When r extends that prompt, the request bound has ended, and
// the peer's share no longer counts it in flight (ended.go), taken or not.
func (f *Fleet) BindPeer(r *Request, p PeerSession, now time.Time) bool {
	rep := f.lookup(p.Replica)
	if rep == nil || r.Session == "" || now.Sub(p.At) > f.cfg.SessionTTL {
		return false
	}
	chain := firstChain(r.Chains)
	extends := p.Blocks > 0 && len(chain) >= p.Blocks && chain[p.Blocks-1] == p.Tail
	if extends && p.Router != "" {
		f.peerEnded(p.Router, rep.index, p.At, now)
	}
	at := p.At
	if at.After(now) {
		at = now
	}
	key := SessionKey(r.Session)
	f.smu.Lock()
	if s, ok := f.sessions.byKey[key]; ok && !s.last.Before(at) {
		f.smu.Unlock()
		return false
	}
	f.sessions.bind(key, rep, at).prompt(nil)
	f.smu.Unlock()
	if f.kind == route.NoIndex || !extends {
		return true
	}
	tokens := p.Blocks * r.Chains[0].Tokens
	cut := make([]residency.Chain, 0, len(r.Chains))
	for _, c := range r.Chains {
		if n := min(len(c.Hashes), tokens/max(c.Tokens, 1)); n > 0 {
			cut = append(cut, residency.Chain{Tokens: c.Tokens, Hashes: c.Hashes[:n]})
		}
	}
	var ms residency.MatchScratch
	f.tr.Touch(rep.index, cut, f.indexTime(at), &ms)
	return true
}

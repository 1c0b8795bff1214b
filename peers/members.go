package peers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Shared membership. An admin change (add, drain, undrain, remove a
// backend, a role given on add) made on one router is written to the hash
// {prefix}:members (one field per backend URL: a Member as JSON; a removed
// backend keeps a "removed" entry, so that a router started with it in its
// own list drops it) and {prefix}:members:version is incremented. Every
// round reads the version in its pipeline; when it moved (or the last
// apply failed), the round reads the hash and hands it to
// Config.ApplyMembers, which makes the router's backends agree. So a
// change reaches every router within about 2 × Interval, and a router
// that starts with Redis loads the fleet's membership in its first round.

// Member states.
const (
	MemberServing  = "serving"
	MemberDraining = "draining"
	MemberRemoved  = "removed"
)

// MaxMembers is the most entries a round reads from the members hash.
const MaxMembers = 4096

// scanCount is how many members hash entries one HSCAN asks for.
const scanCount = 256

// Member is one backend as the routers share it.
type Member struct {
	// URL is the backend's base URL, its id.
	URL string `json:"url"`
	// KV, Replay, Models and Role are its options as added ("" role:
	// both).
	KV     string   `json:"kv,omitempty"`
	Replay string   `json:"replay,omitempty"`
	Models []string `json:"models,omitempty"`
	Role   string   `json:"role,omitempty"`
	// State is MemberServing, MemberDraining or MemberRemoved.
	State string `json:"state"`
	// At is when the change was made, on the writer's clock.
	At time.Time `json:"at"`
	// Router names the router that made it.
	Router string `json:"router,omitempty"`
}

func (k keys) members() string        { return k.prefix + ":members" }
func (k keys) membersVersion() string { return k.prefix + ":members:version" }

// PublishMember writes m to the shared membership at once (bounded by
// Config.Timeout); the other routers apply it in their next round. When
// Redis does not answer, m is kept and written by the next round that
// reaches it (the latest change of each backend).
func (s *Syncer) PublishMember(ctx context.Context, m Member) error {
	m.Router = s.cfg.Router
	if m.At.IsZero() {
		m.At = s.cfg.Now()
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	if err := s.writeMembers(ctx, []Member{m}); err != nil {
		s.mmu.Lock()
		if s.unsent == nil {
			s.unsent = map[string]Member{}
		}
		s.unsent[m.URL] = m
		s.mmu.Unlock()
		return fmt.Errorf("shared membership: %w (kept for the next round)", err)
	}
	return nil
}

// writeMembers writes ms and bumps the version, in one transaction.
func (s *Syncer) writeMembers(ctx context.Context, ms []Member) error {
	vals := make([]any, 0, 2*len(ms))
	for _, m := range ms {
		b, err := json.Marshal(m)
		if err != nil {
			return err
		}
		vals = append(vals, m.URL, s.seal.seal(s.keys.member(m.URL), s.cfg.Router, string(b)))
	}
	pipe := s.client.TxPipeline()
	pipe.HSet(ctx, s.keys.members(), vals...)
	pipe.Incr(ctx, s.keys.membersVersion())
	_, err := pipe.Exec(ctx)
	return err
}

// flushMembers writes the changes PublishMember could not.
func (s *Syncer) flushMembers(ctx context.Context) error {
	s.mmu.Lock()
	ms := make([]Member, 0, len(s.unsent))
	for _, m := range s.unsent {
		ms = append(ms, m)
	}
	s.unsent = nil
	s.mmu.Unlock()
	if len(ms) == 0 {
		return nil
	}
	if err := s.writeMembers(ctx, ms); err != nil {
		s.mmu.Lock()
		if s.unsent == nil {
			s.unsent = map[string]Member{}
		}
		for _, m := range ms {
			if _, newer := s.unsent[m.URL]; !newer {
				s.unsent[m.URL] = m
			}
		}
		s.mmu.Unlock()
		return err
	}
	return nil
}

// syncMembers applies the shared membership when its version moved since
// the last apply that succeeded (run by round, after the exchange).
func (s *Syncer) syncMembers(ctx context.Context, version string) error {
	if s.cfg.ApplyMembers == nil || (version == s.applied && !s.retry) {
		return nil
	}
	var ms []Member
	for cursor := uint64(0); ; {
		kv, next, err := s.client.HScan(ctx, s.keys.members(), cursor, "", scanCount).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		for i := 0; i+1 < len(kv) && len(ms) < MaxMembers; i += 2 {
			if m, ok := s.openMember(kv[i], kv[i+1]); ok {
				ms = append(ms, m)
			}
		}
		if next == 0 {
			break
		}
		if len(ms) == MaxMembers {
			s.m.decodeErrors.Inc() // more entries than MaxMembers: the rest unread
			break
		}
		cursor = next
	}
	s.applied = version
	s.retry = s.cfg.ApplyMembers(ms) != nil
	return nil
}

// openMember checks and decodes the members entry v of backend url,
// counting an entry too large, unsealed or malformed, or one that names
// another backend than its field.
func (s *Syncer) openMember(url, v string) (Member, bool) {
	var m Member
	if len(url) > maxMemberBytes || len(v) > maxMemberBytes {
		s.m.decodeErrors.Inc()
		return m, false
	}
	payload, _, ok := s.seal.open(s.keys.member(url), v)
	if !ok {
		s.m.reject(KindMember)
		return m, false
	}
	if json.Unmarshal([]byte(payload), &m) != nil || m.URL != url {
		s.m.decodeErrors.Inc()
		return m, false
	}
	return m, true
}

// member is what backend url's entry in the members hash is sealed under:
// the hash's key and the field, so that an entry moved to another field
// does not check.
func (k keys) member(url string) string { return k.members() + "\x00" + url }

// maxMemberBytes is the largest member entry (and backend URL) decoded.
const maxMemberBytes = 64 << 10

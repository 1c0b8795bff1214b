package route

import "github.com/cespare/xxhash/v2"

// SessionHash sends every request of a session to the same healthy replica
// by consistent hashing of Request.Session over the replicas' IDs; requests
// without a session (Session zero) go to the least-loaded replica.
//
// Source: vLLM production-stack "session" routing (SessionRouter,
// src/vllm_router/routers/routing_logic.py, v0.1.x), which places endpoint
// URLs on a consistent-hash ring (uhashring) keyed by the session header.
// A pure policy cannot keep a ring between calls, so this uses rendezvous
// (highest-random-weight) hashing instead: replica i scores
// mix(Session ^ xxhash64(ID_i)) and the highest score wins. HRW has the
// ring's properties (a session stays put while its replica is healthy; a
// replica leaving moves only its own sessions, evenly over the others) and
// needs no state. See Thaler & Ravishankar, "Using name-based mappings to
// increase hit rates" (1998).
type SessionHash struct{}

// Pick chooses the session's HRW owner, or the least loaded.
func (SessionHash) Pick(r *Request, s *Snapshot) Decision {
	if r.Session == 0 {
		return LeastLoaded{}.Pick(r, s)
	}
	i, _ := hrw(s, r.Session, -1)
	if i < 0 {
		return rejected(r)
	}
	return Decision{Replica: i, Reason: ReasonSession, Matched: matchOf(r, i) * blockSize(s), Costs: costsFor(r, len(s.Replicas))}
}

// hrw returns the healthy replica with the highest rendezvous score for
// key (owner) and the highest-scoring one whose InFlight+1 is at most
// maxLoad (bounded; with maxLoad < 0 there is no bound); -1 when none.
func hrw(s *Snapshot, key uint64, maxLoad float64) (owner, bounded int) {
	owner, bounded = -1, -1
	var ownerScore, boundedScore uint64
	for i := range s.Replicas {
		rp := &s.Replicas[i]
		if !rp.Healthy {
			continue
		}
		score := Mix64(key ^ xxhash.Sum64String(rp.ID))
		if owner < 0 || score > ownerScore {
			owner, ownerScore = i, score
		}
		if maxLoad >= 0 && float64(rp.InFlight+1) > maxLoad {
			continue
		}
		if bounded < 0 || score > boundedScore {
			bounded, boundedScore = i, score
		}
	}
	return owner, bounded
}

var _ Policy = SessionHash{}

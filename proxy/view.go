package proxy

import (
	"time"

	"kvrouter/fleet"
)

// View is a plain copy of the router's live state for dashboards: the
// fleet's view (load, in-flight, sessions, calibration, predicted versus
// actual cached tokens) plus what only the router knows (residency index
// share, scrape status, policy). It holds no references into the router:
// the caller may keep and read it without locks.
type View struct {
	// At is the time the view was taken for.
	At time.Time
	// Policy is the routing policy's name; Index the residency feed it
	// reads: precise (KV events followed; see each replica's IndexMode),
	// approximate or none. Hash is the request hashing: text or tokens.
	Policy string
	Index  string
	Hash   string
	// Sessions is the number of bound sessions.
	Sessions int
	// Decisions is the number of routing decisions made since start.
	Decisions uint64
	// Replicas is in backend order.
	Replicas []ReplicaView
}

// ReplicaView is one replica in a View.
type ReplicaView struct {
	// ReplicaView is the fleet's view: health, the router's in-flight
	// counts, the last scrape's load, KV capacity in index blocks, bound
	// sessions, completed and failed requests, predicted and actual cached
	// prompt-token totals, calibration scale and eviction horizon.
	fleet.ReplicaView
	// URL is the replica's base URL (the same as ID).
	URL string
	// IndexBlocks is the prefix blocks the residency index attributes to
	// the replica, and IndexCapacity its share's bound, in blocks of the
	// router's hasher (TokensPerBlock tokens); zero without an index.
	IndexBlocks, IndexCapacity int
	// ScrapeErrors is the number of consecutive failed /metrics scrapes,
	// and ScrapeError the last one's message (empty after a success).
	ScrapeErrors int
	ScrapeError  string
	// IndexMode is the feed the replica is matched against now: precise,
	// approximate (its event stream is missing or stale, or not followed)
	// or none.
	IndexMode string
	// KVEvents is the replica's KV-event stream; nil outside precise mode.
	KVEvents *KVEventsView
}

// View returns a copy of the router's state at now.
func (rt *Router) View(now time.Time) View {
	fv := rt.st.fleet.View(now)
	rt.decisions.mu.Lock()
	n := rt.decisions.n
	rt.decisions.mu.Unlock()
	v := View{
		At: now, Policy: rt.policyName, Index: rt.st.idx.mode(),
		Sessions: fv.Sessions, Decisions: n,
		Replicas: make([]ReplicaView, len(fv.Replicas)),
	}
	if rt.st.tok != nil {
		v.Hash = hashTokens
	}
	for i, r := range fv.Replicas {
		rv := ReplicaView{ReplicaView: r, URL: r.ID}
		if j := rt.st.replica(r.ID); j >= 0 {
			rv.IndexBlocks, rv.IndexCapacity = rt.st.idx.blocks(j)
			rv.IndexMode = rt.st.idx.modeOf(j)
			if p := rt.st.idx.p; p != nil {
				rv.KVEvents = p.view(j, now)
			}
		}
		if s, ok := rt.st.scraper.Status(r.ID); ok {
			rv.ScrapeErrors = s.Errors
			if s.Err != nil {
				rv.ScrapeError = s.Err.Error()
			}
		}
		v.Replicas[i] = rv
	}
	return v
}

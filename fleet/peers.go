package fleet

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
)

// Bounds of what a fleet keeps for its peers between two Exports.
const (
	// DefaultMaxShared is the most bindings, and the most touches, a
	// fleet holds for its next Export when SharePeers is given zero; past
	// it the newest are dropped (and counted: Share.Dropped).
	DefaultMaxShared = 4096
	// MaxSharedHashes is the most block hashes of one touch's chain that
	// are shared: the leading ones (a longer prompt shares its first
	// 4096 blocks, 64k tokens at 16 tokens a block).
	MaxSharedHashes = 4096
	// MaxSharedChains is the most chains of one touch that Merge reads
	// (one per engine block size in the fleet; more are a peer's error).
	MaxSharedChains = 8
	// MaxTouchAge is the oldest a peer's touch may be to enter the index:
	// older ones (a router catching up after a pause) are skipped, their
	// blocks being as likely gone as not.
	MaxTouchAge = time.Minute
)

// Share is what one router tells the others of its fleet (Export), and
// what Merge folds into theirs. Load is absolute, so that a lost Share
// costs nothing once the next arrives; Sessions and Touches are what
// happened since the previous Export, so each is sent once.
type Share struct {
	// Router names the router (set by the transport; Merge ignores it).
	Router string `json:"router"`
	// At is when the share was exported, on the exporter's clock.
	At time.Time `json:"at"`
	// Load is the exporter's own in-flight accounting, one entry per
	// replica with any load.
	Load []PeerLoad `json:"load,omitempty"`
	// Sessions are the sessions the exporter bound since its previous
	// Export.
	Sessions []Binding `json:"sessions,omitempty"`
	// Touches are the routing decisions' blocks since the previous Export:
	// the approximate index's, and the precise mode's just-routed overlay's,
	// entries.
	Touches []Touch `json:"touches,omitempty"`
	// Dropped is how many bindings and touches did not fit since the
	// previous Export (see DefaultMaxShared).
	Dropped int `json:"dropped,omitempty"`
}

// PeerLoad is one router's in-flight accounting on one replica: what its
// tickets hold (see Ticket).
type PeerLoad struct {
	// Replica is the replica's id.
	Replica string `json:"replica"`
	// InFlight is the requests in flight there.
	InFlight int64 `json:"in_flight,omitempty"`
	// PrefillTokens is the prompt tokens still to prefill there.
	PrefillTokens int64 `json:"prefill_tokens,omitempty"`
	// Decoding is the requests past their first token there.
	Decoding int64 `json:"decoding,omitempty"`
	// DecodeTokens is the KV footprint, in tokens, of the requests there.
	DecodeTokens int64 `json:"decode_tokens,omitempty"`
}

// Binding is one session bound to a replica.
type Binding struct {
	// Key is the session's key (SessionKey of its id).
	Key string `json:"key"`
	// Replica is the replica's id.
	Replica string `json:"replica"`
	// At is when it was bound.
	At time.Time `json:"at"`
}

// Touch is one request's blocks sent to a replica.
type Touch struct {
	// Replica is the replica's id.
	Replica string `json:"replica"`
	// At is when the request was routed.
	At time.Time `json:"at"`
	// Chains are the request's chains (residency.Chain), each cut to
	// MaxSharedHashes.
	Chains []SharedChain `json:"chains"`
}

// SharedChain is a residency.Chain as shared.
type SharedChain struct {
	// Tokens is the prompt tokens one block stands for.
	Tokens int `json:"tokens"`
	// Hashes are the chained block hashes, block 0 first.
	Hashes []prefix.Hash `json:"hashes"`
}

// peers is a fleet's side of sharing: the outbox of what the next Export
// sends, and the peers' load as the last Merge left it.
type peers struct {
	on  atomic.Bool // SharePeers was called: commit fills the outbox
	max int

	// mu guards sessions, touches and dropped (the outbox).
	mu       sync.Mutex
	sessions []Binding
	touches  []Touch
	dropped  int

	// load is the other routers' in-flight accounting summed, by replica
	// index: what snapshots add to the fleet's own (nil: none).
	load atomic.Pointer[[]PeerLoad]

	// mmu serializes Merges (it guards ms, last and ended).
	mmu sync.Mutex
	ms  residency.MatchScratch
	// last is the peers' shares as the last Merge got them, their load
	// only: summed again when a request of theirs is seen to have ended.
	last []Share
	// ended are the peers' requests seen to have ended that their shares
	// may still count (ended.go).
	ended []endedTurn
}

// SharePeers makes the fleet keep, for Export, the sessions it binds and
// the blocks it routes, at most max of each between two Exports (zero
// means DefaultMaxShared). A fleet that is never told this keeps nothing
// (one router: no cost).
func (f *Fleet) SharePeers(max int) {
	if max <= 0 {
		max = DefaultMaxShared
	}
	f.peers.mu.Lock()
	f.peers.max = max
	f.peers.mu.Unlock()
	f.peers.on.Store(true)
}

// note records one committed decision for the next Export: the session
// bound and the blocks touched on rep at now.
func (p *peers) note(r *Request, rep *replica, now time.Time) {
	if !p.on.Load() {
		return
	}
	var tc Touch
	if len(r.Chains) > 0 {
		tc = Touch{Replica: rep.id, At: now, Chains: make([]SharedChain, len(r.Chains))}
		for i, c := range r.Chains {
			h := c.Hashes[:min(len(c.Hashes), MaxSharedHashes)]
			tc.Chains[i] = SharedChain{Tokens: c.Tokens, Hashes: append([]prefix.Hash(nil), h...)}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if r.Session != "" {
		if len(p.sessions) < p.max {
			p.sessions = append(p.sessions, Binding{Key: SessionKey(r.Session), Replica: rep.id, At: now})
		} else {
			p.dropped++
		}
	}
	if tc.Chains != nil {
		if len(p.touches) < p.max {
			p.touches = append(p.touches, tc)
		} else {
			p.dropped++
		}
	}
}

// Export returns the fleet's share at now: its own in-flight accounting on
// every replica, and the bindings and touches since the previous Export
// (which it takes: each is exported once).
func (f *Fleet) Export(now time.Time) Share {
	s := Share{At: now}
	f.mu.RLock()
	for _, r := range f.reps {
		l := PeerLoad{Replica: r.id, InFlight: r.inFlight.Load(), PrefillTokens: max(r.prefillTokens.Load(), 0),
			Decoding: r.decoding.Load(), DecodeTokens: max(r.decodeTokens.Load(), 0)}
		if l != (PeerLoad{Replica: r.id}) {
			s.Load = append(s.Load, l)
		}
	}
	f.mu.RUnlock()
	p := &f.peers
	p.mu.Lock()
	s.Sessions, s.Touches, s.Dropped = p.sessions, p.touches, p.dropped
	p.sessions, p.touches, p.dropped = nil, nil, 0
	p.mu.Unlock()
	return s
}

// Merge folds the other routers' latest shares into the fleet at now: the
// peers' load replaces what the previous Merge left (a router absent from
// shares counts for nothing: it is gone, or unreachable), their bindings
// bind sessions here too unless bound here since, and their touches enter
// the residency index as this fleet's own decisions would. Entries naming
// replicas this fleet does not know are skipped. The simulator's and the
// live router's sync both come through here; only the transport differs.
func (f *Fleet) Merge(now time.Time, shares []Share) {
	p := &f.peers
	p.mmu.Lock()
	defer p.mmu.Unlock()
	p.last = p.last[:0]
	for i := range shares {
		p.last = append(p.last, Share{Router: shares[i].Router, At: shares[i].At, Load: shares[i].Load})
	}
	p.pruneEnded(p.last)
	f.mergeLoad(p.last)
	for i := range shares {
		for _, b := range shares[i].Sessions {
			f.mergeBinding(b, now)
		}
	}
	if f.kind == route.NoIndex {
		return
	}
	chains := make([]residency.Chain, 0, 4)
	for i := range shares {
		for _, tc := range shares[i].Touches {
			r := f.lookup(tc.Replica)
			if r == nil || now.Sub(tc.At) > MaxTouchAge {
				continue
			}
			at := tc.At
			if at.After(now) {
				at = now // a peer's clock ahead of ours
			}
			chains = chains[:0]
			for _, c := range tc.Chains[:min(len(tc.Chains), MaxSharedChains)] {
				if c.Tokens > 0 && len(c.Hashes) > 0 {
					chains = append(chains, residency.Chain{Tokens: c.Tokens, Hashes: c.Hashes[:min(len(c.Hashes), MaxSharedHashes)]})
				}
			}
			if len(chains) > 0 {
				f.tr.Touch(r.index, chains, f.indexTime(at), &p.ms)
			}
		}
	}
}

// mergeLoad sums the shares' load by replica, less the requests they
// count that have ended (ended.go), and publishes it, bumping the version
// of every replica whose peers' load moved. f.peers.mmu is held.
func (f *Fleet) mergeLoad(shares []Share) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	var sum []PeerLoad
	for i := range shares {
		for _, l := range shares[i].Load {
			r := f.byID[l.Replica]
			if r == nil {
				continue
			}
			l = f.peers.withoutEnded(&shares[i], r.index, l)
			if sum == nil {
				sum = make([]PeerLoad, len(f.reps))
			}
			s := &sum[r.index]
			s.InFlight += bounded(l.InFlight)
			s.PrefillTokens += bounded(l.PrefillTokens)
			s.Decoding += bounded(l.Decoding)
			s.DecodeTokens += bounded(l.DecodeTokens)
		}
	}
	var old []PeerLoad
	if o := f.peers.load.Load(); o != nil {
		old = *o
	}
	if sum == nil && old == nil {
		return
	}
	f.peers.load.Store(&sum)
	for i, r := range f.reps {
		var a, b PeerLoad
		if i < len(old) {
			a = old[i]
		}
		if i < len(sum) {
			b = sum[i]
		}
		if a != b {
			r.changed()
		}
	}
}

// maxPeerCount bounds one peer's count (bounded), so that the sums of
// any number of peers stay far from overflowing.
const maxPeerCount = 1 << 40

// bounded is a peer's count within 0..maxPeerCount.
func bounded(v int64) int64 { return min(max(v, 0), maxPeerCount) }

// mergeBinding binds a peer's session here, unless it is bound here more
// recently or names a replica this fleet does not know.
func (f *Fleet) mergeBinding(b Binding, now time.Time) {
	r := f.lookup(b.Replica)
	if r == nil || b.Key == "" || len(b.Key) > MaxSessionIDBytes || now.Sub(b.At) > f.cfg.SessionTTL {
		return
	}
	if b.At.After(now) {
		b.At = now // a peer's clock ahead of ours
	}
	f.smu.Lock()
	defer f.smu.Unlock()
	if s, ok := f.sessions.byKey[b.Key]; ok && !s.last.Before(b.At) {
		return
	}
	f.sessions.bind(b.Key, r, b.At).prompt(nil)
}

// peerLoad returns the peers' load on replica i (zero: none).
func (f *Fleet) peerLoad(i int) PeerLoad {
	if l := f.peers.load.Load(); l != nil && i < len(*l) {
		return (*l)[i]
	}
	return PeerLoad{}
}

// PeerLoad returns the other routers' in-flight accounting on replica id,
// as the last Merge left it; zero for an unknown id or without peers.
func (f *Fleet) PeerLoad(id string) PeerLoad {
	r := f.lookup(id)
	if r == nil {
		return PeerLoad{}
	}
	l := f.peerLoad(r.index)
	l.Replica = id
	return l
}

package fleet

import "time"

// A peer's share counts its requests in flight when it is exported, and
// stays this fleet's view of that peer's load for up to two sync
// intervals. A conversation whose turns alternate between routers faster
// than that finds the previous turn, which has ended, still counted on its
// replica by the router that routed it: priced busy, the session's
// replica could lose the next turn to an idle one. The next turn is the
// proof that the previous one ended (it extends the prompt the previous
// one was bound with, answer included). So BindPeer notes the ended
// request, and the peer's share exported after the request was routed and
// before the next turn arrived counts one request fewer on that replica;
// the peer's next share, exported since, no longer counts it.

// maxEnded bounds the ended requests a fleet keeps (the oldest go first).
const maxEnded = 4096

// endedTurn is a peer's request known to have ended.
type endedTurn struct {
	router  string
	replica int
	// routed is when the peer routed the request (its clock); seen is
	// when the next turn of its session arrived here (this fleet's).
	routed, seen time.Time
}

// counts reports whether share s, exported by e's router, counted e in
// flight on replica i: exported after e was routed, before it was seen to
// have ended.
func (e endedTurn) counts(s *Share, i int) bool {
	return e.router == s.Router && e.replica == i && !s.At.Before(e.routed) && s.At.Before(e.seen)
}

// peerEnded notes that router's request routed at routed to replica i has
// ended (seen at now) and sums the peers' load again without it.
func (f *Fleet) peerEnded(router string, i int, routed, now time.Time) {
	p := &f.peers
	p.mmu.Lock()
	defer p.mmu.Unlock()
	for _, e := range p.ended {
		if e.router == router && e.replica == i && e.routed.Equal(routed) {
			return // noted already (a retry reads the binding again)
		}
	}
	if len(p.ended) >= maxEnded {
		p.ended = append(p.ended[:0], p.ended[1:]...)
	}
	p.ended = append(p.ended, endedTurn{router: router, replica: i, routed: routed, seen: now})
	f.mergeLoad(p.last)
}

// withoutEnded returns l, share s's load on replica i, less the requests
// of p.ended that s counted: fewer in flight, and the rest of its load in
// proportion.
func (p *peers) withoutEnded(s *Share, i int, l PeerLoad) PeerLoad {
	d := int64(0)
	for _, e := range p.ended {
		if e.counts(s, i) {
			d++
		}
	}
	n := l.InFlight
	if d == 0 || n <= 0 {
		return l
	}
	keep := max(n-d, 0)
	scale := func(v int64) int64 { return int64(float64(bounded(v)) * float64(keep) / float64(n)) }
	return PeerLoad{Replica: l.Replica, InFlight: keep, PrefillTokens: scale(l.PrefillTokens),
		Decoding: min(bounded(l.Decoding), keep), DecodeTokens: scale(l.DecodeTokens)}
}

// pruneEnded drops the ended requests no share counts any more: their
// router's share was exported since they were seen (or it has none).
func (p *peers) pruneEnded(shares []Share) {
	kept := p.ended[:0]
	for _, e := range p.ended {
		for i := range shares {
			if shares[i].Router == e.router && shares[i].At.Before(e.seen) {
				kept = append(kept, e)
				break
			}
		}
	}
	clear(p.ended[len(kept):])
	p.ended = kept
}

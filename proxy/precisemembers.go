package proxy

import (
	"fmt"
	"net/url"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/residency"
)

// A backend added while the router runs gets a Subscriber of its own,
// connected to its kv= endpoint, writing the same precise index under its
// slot; its removal closes it. A backend given at start is followed by
// the router's first Subscriber, which stops following its slot when it is
// removed (kvevents.Subscriber.Stop). An added backend without kv= (bind
// mode) is tracked approximately: the bind socket's replicas are fixed at
// start.

// subOf returns the Subscriber that follows slot i.
func (p *precise) subOf(i int) *kvevents.Subscriber {
	if i >= 0 && i < len(p.added) {
		if s := p.added[i].Load(); s != nil {
			return s
		}
	}
	return p.sub
}

// add starts following the events of backend b, just added in slot i.
func (p *precise) add(i int, b Backend) error {
	if b.KV == "" {
		p.log.Warn("kv events: added backend has no kv= endpoint; approximate tracking only (bind-mode replicas are fixed at start)", "replica", b.URL)
		return nil
	}
	r := kvevents.Replica{ID: i, Endpoint: b.KV, Replay: b.Replay}
	if len(b.Models) > 0 {
		r.Model = b.Models[0]
	}
	if u, err := url.Parse(b.URL); err == nil {
		r.Addr = u.Host
	}
	s, err := p.startOne(r)
	if err != nil {
		return fmt.Errorf("kv events of %s: %w", b.URL, err)
	}
	if old := p.added[i].Swap(s); old != nil {
		old.Close()
	}
	p.followed[i].Store(true)
	return nil
}

// stop stops following slot i's events (its backend was removed), so
// that a backend later given the slot is not fed another engine's blocks.
func (p *precise) stop(i int) {
	if i < 0 || i >= len(p.followed) || !p.followed[i].Swap(false) {
		return
	}
	if s := p.added[i].Swap(nil); s != nil {
		s.Close()
		return
	}
	p.sub.Stop(i)
}

// closeAll closes every Subscriber.
func (p *precise) closeAll() {
	for i := range p.added {
		if s := p.added[i].Swap(nil); s != nil {
			s.Close()
		}
	}
	p.sub.Close()
}

// feedOf is the tracker's feed: each slot's Subscriber.
type feedOf struct{ p *precise }

// Healthy implements residency.Feed.
func (f feedOf) Healthy(r int) bool { return f.p.subOf(r).Healthy(r) }

// Expect implements residency.Feed.
func (f feedOf) Expect(r int) { f.p.subOf(r).Expect(r) }

var _ residency.Feed = feedOf{}

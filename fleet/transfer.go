package fleet

import (
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
)

// KV transfers (route.Decision.Transfer) are on when the fleet's rates can
// transfer (Config.Rates.TransferPerMTokens > 0: the operator enabled
// them). The fleet then books each transfer it orders on both replicas'
// links, so that the next decisions see them busy (route.Replica.LinkWait)
// for as long as the transfer was predicted to take: the router's own
// account, as for its in-flight requests, since engines report no link
// use.

// transfers reports whether the fleet orders KV transfers.
func (f *Fleet) transfers() bool { return f.preset.TransferPerMTokens > 0 }

// bookLinks books decision d's transfer, if any, on the links of its
// replica and its source until now + its predicted time; the prediction
// already waited for what either link carried.
func (f *Fleet) bookLinks(d route.Decision, now time.Time) {
	t := d.Transfer
	if t.Blocks <= 0 || t.From < 0 {
		return
	}
	until := now.Add(t.Time).UnixNano()
	f.mu.RLock()
	defer f.mu.RUnlock()
	for _, i := range [2]int{d.Replica, t.From} {
		if i < len(f.reps) {
			r := f.reps[i]
			for old := r.linkUntil.Load(); old < until && !r.linkUntil.CompareAndSwap(old, until); old = r.linkUntil.Load() {
			}
		}
	}
}

// linkWaits sets each entry's LinkWait at now, when the fleet transfers;
// f.mu is held.
func (f *Fleet) linkWaits(dst *route.Snapshot, now time.Time) {
	if !f.transfers() {
		return
	}
	ns := now.UnixNano()
	for i, r := range f.reps {
		dst.Replicas[i].LinkWait = time.Duration(max(r.linkUntil.Load()-ns, 0))
	}
}

// A replica computes a request's uncached blocks by its first token: until
// then no peer can import them (its engine sends only what it holds), yet
// the index matches them there from the moment the request was sent. So
// when the fleet transfers, each replica keeps its requests still in
// prefill, with the first block each computes, and Decide tells the policy
// how much of every match is settled (route.Request.Settled): a burst of
// requests sharing a new prefix does not order imports of it from the
// replica still computing it, each to fail and compute it again.

// computing is a request a replica has yet to reach the first token of:
// it computes its prompt's blocks from block on (of tokens tokens each, in
// the chain whose hash of that block is hash: a prefix hash, so a request
// with the same hash there shares the prompt up to it).
type computing struct {
	t             *Ticket
	block, tokens int
	hash          prefix.Hash
}

// prefills is a replica's requests in prefill, when the fleet transfers.
type prefills struct {
	mu   sync.Mutex
	list []computing
}

// add records ticket t, which computes chain c from token cached on.
func (p *prefills) add(t *Ticket, c *residency.Chain, cached int) {
	if c.Tokens <= 0 {
		return
	}
	b := max(cached, 0) / c.Tokens
	if b >= len(c.Hashes) {
		return
	}
	p.mu.Lock()
	p.list = append(p.list, computing{t: t, block: b, tokens: c.Tokens, hash: c.Hashes[b]})
	p.mu.Unlock()
}

// drop forgets ticket t.
func (p *prefills) drop(t *Ticket) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k := range p.list {
		if p.list[k].t == t {
			last := len(p.list) - 1
			p.list[k], p.list[last] = p.list[last], computing{}
			p.list = p.list[:last]
			return
		}
	}
}

// settled is how many of the leading match blocks (of unit tokens) of
// chain c are computed: up to the first block a request still in prefill
// computes of the same prompt.
func (p *prefills) settled(c *residency.Chain, unit, match int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.list {
		if e.tokens == c.Tokens && e.block < len(c.Hashes) && c.Hashes[e.block] == e.hash {
			match = min(match, e.block*e.tokens/unit)
		}
	}
	return match
}

// settle fills sc's Settled for r's matches when the fleet transfers and
// some replica is computing part of one; nil otherwise.
func (f *Fleet) settle(r *Request, unit int, sc *Scratch) []int {
	if !f.transfers() || len(r.Chains) == 0 || unit <= 0 {
		return nil
	}
	c := &r.Chains[0]
	f.mu.RLock()
	defer f.mu.RUnlock()
	var out []int
	for i, m := range sc.match {
		if m <= 0 || i >= len(f.reps) {
			continue
		}
		if s := f.reps[i].prefills.settled(c, unit, m); s < m {
			if out == nil {
				sc.settled = fit(sc.settled, len(sc.match))
				copy(sc.settled, sc.match)
				out = sc.settled
			}
			out[i] = s
		}
	}
	return out
}

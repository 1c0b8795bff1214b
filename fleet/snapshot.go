package fleet

import (
	"math"
	"math/bits"
	"time"

	"github.com/kvrouter/kvrouter/route"
)

// Snapshot fills dst with the fleet as the policy sees it at now, in
// blocks of unit tokens (zero means Config.BlockSize), reusing
// dst.Replicas' backing array (so a caller that keeps one Snapshot per
// goroutine allocates nothing in steady state). LoadAge is now minus the
// last scrape's time; IndexBlocks is what the tracker attributes to each
// replica. A replica with no TTFT observation yet gets the geometric mean
// of the others' learned scales as its Scale and the root mean square of
// their spreads as its Spread (calTotals.prior), and one with no
// inter-token latency observation the same of DecodeScale and
// DecodeSpread; Seqs is the
// fleet's average as of its last decision. Every replica is written
// afresh; Decide instead keeps its Scratch's snapshot and rewrites only
// what changed since (see snapCache).
func (f *Fleet) Snapshot(dst *route.Snapshot, now time.Time, unit int) {
	unit = f.unit(unit)
	d := divider(unit)
	f.mu.RLock()
	f.size(dst, unit)
	dst.Summary, dst.Seqs = nil, math.Float64frombits(f.seqs.Load())
	prior := f.priors(len(f.reps))
	for i, r := range f.reps {
		out := &dst.Replicas[i]
		if p := f.fill(out, r, d, prior); p.scraped {
			out.LoadAge = max(now.Sub(p.loadAt), 0)
		}
		f.recentPrefill(out, r, now)
	}
	f.linkWaits(dst, now)
	f.mu.RUnlock()
	f.tr.EachBlocks(len(dst.Replicas), func(r, b int) { dst.Replicas[r].IndexBlocks = b })
}

// unit is a snapshot's block size: unit, or Config.BlockSize.
func (f *Fleet) unit(unit int) int {
	if unit <= 0 {
		return f.cfg.BlockSize
	}
	return unit
}

// size gives dst one entry per replica, reusing its array when it can;
// f.mu is held.
func (f *Fleet) size(dst *route.Snapshot, unit int) {
	n := len(f.reps)
	if cap(dst.Replicas) < n {
		dst.Replicas = make([]route.Replica, n, max(f.cfg.MaxReplicas, n))
	}
	dst.Replicas, dst.BlockSize = dst.Replicas[:n], unit
}

// recentPrefill sets out's RecentPrefill at now, when the policy asked for
// a window.
func (f *Fleet) recentPrefill(out *route.Replica, r *replica, now time.Time) {
	if f.needs.Window <= 0 {
		return
	}
	r.mu.Lock()
	prefill, _ := r.recent.Sum(now, f.needs.Window)
	r.mu.Unlock()
	out.RecentPrefill = int(prefill)
}

// snapCache is what a Scratch remembers of the snapshot it holds, so that
// the next fill (refresh) rewrites only the replicas whose state changed
// since, their version having moved (replica.ver), and otherwise only what
// depends on now (LoadAge, RecentPrefill) or on the whole fleet (the
// prior scale, the tracker's counts). Each entry is then what a full
// Snapshot would write. Its arrays are by replica index, dense, so that
// finding what changed reads a few cache lines, not every entry.
type snapCache struct {
	f     *Fleet         // the fleet it was filled from; nil: none yet
	unit  int            // the block size it was filled at
	base  *route.Replica // &Snapshot.Replicas[0] when filled
	prior priors         // the priors it was filled with

	ver    []uint64 // each replica's version when filled; zero: never
	blocks []int    // each entry's IndexBlocks
	// indexed is the tracker's counts as a fill copies them (CopyBlocks).
	indexed []int
	// uncal says which of the entry's scales are the prior: uncalScale,
	// uncalDecode.
	uncal  []uint8
	loadAt []stamp // the entry's last scrape, for LoadAge (scraped ones)
	// scraped lists the entries that were ever scraped (listed says which),
	// whose LoadAge every fill sets.
	scraped []int32
	listed  []bool
	// forced lists the entries Decide marked unhealthy (excluded, or not
	// serving the request's model): the next fill restores their Healthy.
	forced []int32
	// sum is the snapshot's Summary when the policy asks for one
	// (Needs.Summarize), kept as entries change; dirty lists the entries
	// rewritten by a fill, which it summarises once their LoadAge is set.
	sum   *route.Summary
	dirty []int32
}

// begin readies c for a fill of dst (sized) from f at unit: when any of
// them changed (or dst.Replicas was reallocated), it forgets every entry,
// so that all are filled afresh; otherwise it restores what Decide
// forced. f.mu is held.
func (c *snapCache) begin(f *Fleet, dst *route.Snapshot, unit int) {
	n := len(dst.Replicas)
	var base *route.Replica
	if n > 0 {
		base = &dst.Replicas[0]
	}
	c.dirty = c.dirty[:0]
	if c.sum != nil && c.sum.Len() != n {
		c.base = nil // a replica added: summarise all afresh
	}
	if c.f != f || c.unit != unit || c.base != base || len(c.ver) < n {
		m := max(f.cfg.MaxReplicas, n)
		c.f, c.unit, c.base = f, unit, base
		c.ver, c.blocks, c.uncal, c.loadAt = fit(c.ver, m), fit(c.blocks, m), fit(c.uncal, m), fit(c.loadAt, m)
		c.listed = fit(c.listed, m)
		clear(c.ver)
		clear(c.listed)
		c.scraped, c.forced = c.scraped[:0], c.forced[:0]
		c.sum, dst.Summary = nil, nil
		if f.needs.Summarize {
			c.sum = route.NewSummary(f.needs.StaleAfter)
			c.sum.Reset(n)
		}
		return
	}
	for _, i := range c.forced {
		if int(i) < n {
			dst.Replicas[i].Healthy, dst.Replicas[i].Prefills = f.reps[i].candidate(), f.reps[i].prefillWorker()
			c.dirty = append(c.dirty, i)
		}
	}
	c.forced = c.forced[:0]
}

// summarise brings c's Summary of dst up to date after a fill, once every
// LoadAge is set: the entries rewritten or restored, and those whose
// LoadAge crossed the Summary's StaleAfter (c.dirty).
func (c *snapCache) summarise(dst *route.Snapshot) {
	if c.sum == nil {
		return
	}
	for _, i := range c.dirty {
		c.sum.Update(dst, int(i))
	}
	dst.Summary = c.sum
}

// force marks entry i unhealthy in dst, to be restored by the next fill.
func (c *snapCache) force(dst *route.Snapshot, i int) {
	if rp := &dst.Replicas[i]; rp.Healthy || rp.Prefills {
		rp.Healthy, rp.Prefills = false, false
		c.forced = append(c.forced, int32(i))
		if c.sum != nil {
			c.sum.Update(dst, i)
		}
	}
}

// refresh fills dst as Snapshot does, rewriting only what changed since
// c's last fill of it.
func (f *Fleet) refresh(dst *route.Snapshot, c *snapCache, now time.Time, unit int) {
	unit = f.unit(unit)
	d := divider(unit)
	f.mu.RLock()
	f.size(dst, unit)
	n := len(f.reps)
	c.begin(f, dst, unit)
	if prior := f.priors(n); prior != c.prior {
		moved := prior.moved(c.prior)
		c.prior = prior
		for i := range n {
			if u := c.uncal[i] & moved; u != 0 {
				if !prior.apply(&dst.Replicas[i].Rates, u) {
					c.ver[i] = 0 // back to the replica's own scale: refill
				}
				c.dirty = append(c.dirty, int32(i))
			}
		}
	}
	for i := range n {
		// The version is read before the state: a change racing with the
		// fill moves it again, and the next fill rewrites the entry.
		if v := f.vers[i].Load(); v != c.ver[i] {
			f.refill(dst, c, i, v, d)
		}
	}
	nowStamp := stampOf(now)
	for _, i := range c.scraped {
		if out := &dst.Replicas[i]; out.Scraped {
			out.LoadAge = max(nowStamp.sub(c.loadAt[i]), 0)
			if c.sum != nil && c.sum.IsFresh(out) != c.sum.Fresh(int(i)) {
				c.dirty = append(c.dirty, i) // its metrics came of age
			}
		}
	}
	if f.needs.Window > 0 {
		for i, r := range f.reps {
			f.recentPrefill(&dst.Replicas[i], r, now)
		}
	}
	f.linkWaits(dst, now)
	f.mu.RUnlock()
	c.summarise(dst)
	// The tracker's counts, copied dense and compared with the entries'.
	c.indexed = fit(c.indexed, n)
	copy(c.indexed, c.blocks[:n])
	f.tr.CopyBlocks(c.indexed)
	for r, b := range c.indexed {
		if c.blocks[r] != b {
			c.blocks[r], dst.Replicas[r].IndexBlocks = b, b
		}
	}
}

// refill rewrites entry i of dst, the replica being at version v; f.mu is
// held.
func (f *Fleet) refill(dst *route.Snapshot, c *snapCache, i int, v uint64, d divider) {
	out := &dst.Replicas[i]
	p := f.fill(out, f.reps[i], d, c.prior)
	if p.scraped && !c.listed[i] {
		c.scraped, c.listed[i] = append(c.scraped, int32(i)), true
	}
	c.ver[i], c.blocks[i], c.uncal[i], c.loadAt[i] = v, 0, p.uncal(), stampOf(p.loadAt)
	c.dirty = append(c.dirty, int32(i))
}

// stamp is a time with, when Time.Sub between two such times is the plain
// difference of their Unix nanoseconds, those (wall): the time carries no
// monotonic reading and lies in 1970..2200, so that two of them are less
// than 292 years apart and their difference cannot overflow. Time.Sub
// without monotonic readings (the simulator's clock, a fake one) checks
// for overflow at some 20 ns a call: too slow for a thousand LoadAges per
// decision.
type stamp struct {
	t    time.Time
	ns   int64
	wall bool
}

func stampOf(t time.Time) stamp {
	if t != t.Round(0) { // a monotonic reading: Sub uses it, cheaply
		return stamp{t: t}
	}
	if y := t.Year(); y < 1970 || y > 2200 {
		return stamp{t: t}
	}
	return stamp{t: t, ns: t.UnixNano(), wall: true}
}

// sub returns s − u, exactly as s.t.Sub(u.t).
func (s stamp) sub(u stamp) time.Duration {
	if s.wall && u.wall {
		return time.Duration(s.ns - u.ns)
	}
	return s.t.Sub(u.t)
}

// divider divides token counts into blocks of unit tokens: by a shift
// when unit is a power of two (block sizes are), which is several times
// cheaper than a division on every replica of every snapshot.
type divider int

// div returns n / unit, rounded down.
func (d divider) div(n int64) int64 {
	if u := int64(d); u&(u-1) == 0 {
		return n >> bits.TrailingZeros64(uint64(u))
	}
	return n / int64(d)
}

// fill writes one replica's view in blocks of d tokens, but for what
// depends on now (LoadAge, RecentPrefill) and IndexBlocks (zero); a scale
// the replica has not learned is the prior, when that is not zero. It
// returns the published state it read.
func (f *Fleet) fill(out *route.Replica, r *replica, d divider, prior priors) *published {
	pl := f.peerLoad(r.index) // other routers' (peers.go); zero without
	*out = route.Replica{
		ID:            r.id,
		Healthy:       r.candidate(),
		Role:          r.role,
		Prefills:      r.prefillWorker(),
		InFlight:      int(r.inFlight.Load() + pl.InFlight),
		PrefillTokens: int(max(r.prefillTokens.Load(), 0) + pl.PrefillTokens),
		Decoding:      int(r.decoding.Load() + pl.Decoding),
		DecodeBlocks:  int(d.div(max(r.decodeTokens.Load(), 0) + pl.DecodeTokens + int64(d) - 1)),
		Outputs:       int(max(r.outputs.Load(), 0)),
		InvOutput:     float64(max(r.invOut.Load(), 0)) / 1e9,
		PrefillWork:   time.Duration(max(r.work.Load(), 0)),
		Share:         math.Float64frombits(r.share.Load()),
		ShareSeq:      r.shareSeq.Load(),
	}
	p := r.pub.Load()
	if p.scraped {
		// Running less the router's requests the scrape counted that
		// finished since (replica.gone; read after p: a newer scrape only
		// resets it). Their KV is not taken off the usage: what they
		// shared with the requests still running stays in use.
		out.Scraped = true
		out.Running, out.Waiting, out.KVUsage = max(p.running-int(r.gone.Load()), 0), p.waiting, p.kvUsage
	}
	out.CacheBlocks, out.Rates = int(d.div(int64(p.capTokens))), p.rates
	prior.apply(&out.Rates, p.uncal())
	return p
}

// Which scales of a replica are not learned (published.uncal).
const (
	uncalScale uint8 = 1 << iota
	uncalDecode
)

// uncal says which of p's scales are not learned.
func (p *published) uncal() uint8 {
	var u uint8
	if !p.calibrated {
		u |= uncalScale
	}
	if !p.dcalibrated {
		u |= uncalDecode
	}
	return u
}

// priors are the scales and spreads a replica that has not learned its
// own takes (calTotals.prior); zero where there is none.
type priors struct{ scale, decode, spread, decodeSpread float64 }

// priors returns the priors of a fleet of n replicas.
func (f *Fleet) priors(n int) priors {
	var pr priors
	pr.scale, pr.spread = f.cal.prior(n)
	pr.decode, pr.decodeSpread = f.dcal.prior(n)
	return pr
}

// moved says which of pr differ from old.
func (pr priors) moved(old priors) uint8 {
	var m uint8
	if pr.scale != old.scale || pr.spread != old.spread {
		m |= uncalScale
	}
	if pr.decode != old.decode || pr.decodeSpread != old.decodeSpread {
		m |= uncalDecode
	}
	return m
}

// apply sets the scales (and their spreads) of rt that uncal says are not learned to the
// priors, and reports false when one of them has no prior (rt then keeps
// the replica's own, which apply does not know).
func (pr priors) apply(rt *route.Rates, uncal uint8) bool {
	ok := true
	if uncal&uncalScale != 0 {
		if pr.scale > 0 {
			rt.Scale, rt.Spread = pr.scale, pr.spread
		} else {
			ok = false
		}
	}
	if uncal&uncalDecode != 0 {
		if pr.decode > 0 {
			rt.DecodeScale, rt.DecodeSpread = pr.decode, pr.decodeSpread
		} else {
			ok = false
		}
	}
	return ok
}

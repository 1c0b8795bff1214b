package residency

import (
	"time"

	"github.com/kvrouter/kvrouter/prefix"
)

// MatchScratch holds one decision's per-replica buffers between Match and
// Touch. Keep one per goroutine and reuse it: Match then allocates nothing.
type MatchScratch struct {
	am, pm, om, cm []int
	// sent is, per replica whose precise stream is trusted, the blocks of
	// unit tokens of the request the approximate index says the router
	// sent it (Evicted); 0 for the others, and empty outside precise
	// mode.
	sent   []int
	aa     []time.Duration
	coarse []prefix.Hash
	// prec is, per replica, the blocks of its chain the precise index held
	// (Touch expects events for the rest).
	prec []int
}

func (sc *MatchScratch) grow(n int) {
	sc.am, sc.pm, sc.om, sc.prec = fit(sc.am, n), fit(sc.pm, n), fit(sc.om, n), fit(sc.prec, n)
	sc.cm = fit(sc.cm, n)
	sc.aa = fit(sc.aa, n)
}

// fit returns s with length n, reusing its array when it is large enough.
func fit[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// Unit is the block size, in tokens, Match expresses its counts in for a
// request with chains: the coarse index block when one is configured, else
// the smallest chain's block; zero without chains.
func (t *Tracker) Unit(chains []Chain) int {
	if t.cfg.CoarseTokens > 0 {
		return t.cfg.CoarseTokens
	}
	u := 0
	for _, c := range chains {
		if c.Tokens > 0 && (u == 0 || c.Tokens < u) {
			u = c.Tokens
		}
	}
	return u
}

// chainOf returns the index in chains of the chain replica r is matched
// with, or -1: the first in text mode, the one of r's engine block size in
// token mode.
func (t *Tracker) chainOf(chains []Chain, r int) int {
	if len(chains) == 0 {
		return -1
	}
	if !t.cfg.Engine {
		return 0
	}
	bs := t.BlockSize(r)
	for i := range chains {
		if chains[i].Tokens == bs {
			return i
		}
	}
	return -1
}

// coarsen returns the approximate index's hashes of c (every k-th block
// when CoarseTokens merges k blocks) and the tokens one of them stands
// for.
func (t *Tracker) coarsen(c *Chain, sc *MatchScratch) ([]prefix.Hash, int) {
	k := 1
	if t.cfg.CoarseTokens > c.Tokens {
		k = t.cfg.CoarseTokens / c.Tokens
	}
	if k == 1 {
		return c.Hashes, c.Tokens
	}
	sc.coarse = sc.coarse[:0]
	for b := k - 1; b < len(c.Hashes); b += k {
		sc.coarse = append(sc.coarse, c.Hashes[b])
	}
	return sc.coarse, k * c.Tokens
}

// Match fills, for every replica r < len(match), match[r] with the leading
// blocks of unit tokens (see Unit) of the request whose chains are given
// that r is believed to hold, and age[r] (age may be nil) with how long
// ago r's deepest matched block was touched, or released by the last
// request that held it (Hold): zero while one does. A replica whose precise
// stream is trusted is matched against the precise index merged with the
// overlay (the longer run wins: both hold a prefix of the chain), at age
// zero: the engine's events say what is resident, so the match does not
// decay. Any other replica is matched against the approximate index.
func (t *Tracker) Match(chains []Chain, now time.Duration, unit int, match []int, age []time.Duration, sc *MatchScratch) {
	clear(match)
	if age != nil {
		clear(age)
	}
	n := len(match)
	sc.grow(n)
	clear(sc.prec)
	precise := t.precise != nil
	sc.sent = sc.sent[:0] // none outside precise mode: Evicted reads nothing
	if precise {
		sc.sent = fit(sc.sent, n)
		clear(sc.sent)
	}
	if t.approx == nil || unit <= 0 {
		return
	}
	for ci := range chains {
		c := &chains[ci]
		if c.Tokens <= 0 || len(c.Hashes) == 0 || !t.cfg.Engine && ci > 0 {
			continue // in text mode every replica takes the first (chainOf)
		}
		hashes, it := t.coarsen(c, sc)
		t.approx.Match(hashes, now, sc.am, sc.aa)
		if t.precise != nil {
			t.precise.Match(c.Hashes, now, sc.pm, nil)
			t.overlay.Match(c.Hashes, now, sc.om, nil)
		}
		per := 0 // units per matched block when whole: no division per replica
		if it%unit == 0 {
			per = it / unit
		}
		for r := range n {
			if t.cfg.Engine && t.chainOf(chains, r) != ci {
				continue
			}
			m := sc.am[r] * per
			if per == 0 && sc.am[r] > 0 {
				m = sc.am[r] * it / unit
			}
			if precise && t.Live(r) {
				sc.prec[r] = sc.pm[r]
				match[r] = max(sc.pm[r], sc.om[r]) * c.Tokens / unit
				sc.sent[r] = m
				continue
			}
			if m > 0 {
				match[r] = m
				if age != nil {
					age[r] = max(sc.aa[r], 0) // held: negative
				}
			}
		}
	}
}

// Evicted names, for the request Match last matched with sc into match,
// the replica that has lost most of what the router sent it: of the
// replicas whose precise stream is trusted, the one whose approximate
// match (the blocks of unit tokens the router's decisions put there,
// sent) most exceeds its precise one (what its engine's events say it
// holds). The difference it stored and has since evicted, and this
// request asks for it again: precise mode learns Rates.Displaced from it,
// as approximate mode does from an old match the engine no longer had
// (precise matches have no age). It returns sent 0 and replica −1 when no
// replica holds less than it was sent.
func (sc *MatchScratch) Evicted(match []int) (sent, replica int) {
	most, replica := 0, -1
	for r, m := range sc.sent[:min(len(sc.sent), len(match))] {
		if d := m - match[r]; d > most {
			most, sent, replica = d, m, r
		}
	}
	return sent, replica
}

// Fresh returns, for replica r matched against the approximate index with
// match blocks of unit tokens (Match), the leading ones of them r touched
// within the last within, and the age of the deepest of those (Index.Fresh);
// 0 and 0 for a replica whose precise stream is trusted (its match does
// not decay) or without chains.
func (t *Tracker) Fresh(chains []Chain, unit, r, match int, within, now time.Duration, sc *MatchScratch) (int, time.Duration) {
	ci := t.chainOf(chains, r)
	if t.approx == nil || unit <= 0 || ci < 0 || t.Live(r) {
		return 0, 0
	}
	hashes, it := t.coarsen(&chains[ci], sc)
	if it <= 0 {
		return 0, 0
	}
	n, age := t.approx.Fresh(r, hashes, match*unit/it, within, now)
	return n * it / unit, max(age, 0) // held: negative
}

// MatchOffloaded fills, for every replica r < len(out) whose precise
// stream is trusted, out[r] with the leading blocks of unit tokens of the
// request the replica holds off the GPU only (its CPU tier), and with 0
// for the others. It reports whether any replica holds one. Engines that
// offload write through (every computed block is copied), so a chain's
// off-GPU run is usually at least its GPU run: the blocks past the GPU's
// load from host memory.
func (t *Tracker) MatchOffloaded(chains []Chain, now time.Duration, unit int, out []int, sc *MatchScratch) bool {
	clear(out)
	if t.offload == nil || unit <= 0 || t.offload.Len() == 0 {
		return false
	}
	n := len(out)
	sc.grow(n)
	any := false
	for ci := range chains {
		c := &chains[ci]
		if c.Tokens <= 0 || len(c.Hashes) == 0 || !t.cfg.Engine && ci > 0 {
			continue // in text mode every replica takes the first (chainOf)
		}
		t.offload.Match(c.Hashes, now, sc.cm, nil)
		for r := range n {
			if sc.cm[r] > 0 && t.chainOf(chains, r) == ci && t.Live(r) {
				out[r] = sc.cm[r] * c.Tokens / unit
				any = true
			}
		}
	}
	return any
}

// Touch records that the request whose chains were just matched (with sc)
// was sent to replica r at now: its blocks enter r's approximate share (in
// precise mode too: the fallback of a replica whose stream fails, and
// what Evicted compares the engine's own with), and in precise mode the
// overlay; when r's precise index lacked some of them, the feed is told
// to expect events for r.
func (t *Tracker) Touch(r int, chains []Chain, now time.Duration, sc *MatchScratch) {
	ci := t.chainOf(chains, r)
	if t.approx == nil || ci < 0 || len(chains[ci].Hashes) == 0 {
		return
	}
	c := &chains[ci]
	hashes, _ := t.coarsen(c, sc)
	t.approx.Touch(r, hashes, now)
	if t.precise == nil || !t.Live(r) {
		return
	}
	t.overlay.Touch(r, c.Hashes, now)
	if t.feed != nil && r < len(sc.prec) && sc.prec[r] < len(c.Hashes) {
		t.feed.Expect(r)
	}
}

// EachBlocks calls f with the blocks the tracker attributes to every
// replica r < n: its precise count when its stream is trusted, else its
// approximate one.
func (t *Tracker) EachBlocks(n int, f func(r, blocks int)) {
	if t.approx == nil {
		return
	}
	if t.precise == nil {
		t.approx.EachBlocks(n, f)
		return
	}
	t.approx.EachBlocks(n, func(r, b int) {
		if !t.Live(r) {
			f(r, b)
		}
	})
	t.precise.EachBlocks(n, func(r, b int) {
		if t.Live(r) {
			f(r, b)
		}
	})
}

// CopyBlocks is EachBlocks into dst, for every replica r < len(dst):
// dense, for a caller that compares them with what it had. Without an
// index it leaves dst alone.
func (t *Tracker) CopyBlocks(dst []int) {
	if t.approx == nil {
		return
	}
	if t.precise == nil {
		t.approx.CopyBlocks(dst, nil)
		return
	}
	t.approx.CopyBlocks(dst, func(r int) bool { return !t.Live(r) })
	t.precise.CopyBlocks(dst, t.Live)
}

// Blocks returns the blocks the tracker attributes to replica r and the
// capacity of the share they count against (index blocks approximate,
// engine blocks precise).
func (t *Tracker) Blocks(r int) (held, capacity int) {
	if t.approx == nil || r < 0 || r >= len(t.caps) {
		return 0, 0
	}
	if t.Live(r) {
		return t.precise.Blocks(r), int(t.pcaps[r].Load())
	}
	return t.approx.Blocks(r), int(t.caps[r].Load())
}

package fleet

import (
	"time"

	"github.com/kvrouter/kvrouter/scrape"
)

// Churn estimates a replica's eviction horizon (route.Rates.Horizon) from
// its scraped prefix-cache counters.
//
// The model is deliberately simple: every prompt token the engine could not
// find cached (queries − hits) and every token it generates takes a block
// slot, and once the cache is full each one evicts the least recently used
// cached block. Blocks held by running requests are not in that LRU queue
// (vLLM's free-block queue, vllm/v1/core/kv_cache_utils.py), so an
// untouched block survives about as long as it takes the engine to
// allocate the cache's free part anew:
//
//	Horizon ≈ capacity × (1 − KV usage) / (miss + generated tokens per second)
//
// Before the cache first fills this underestimates the horizon, which only
// makes the policy more cautious about old prefixes. The allocation rate
// is measured over spans of at least Span and smoothed exponentially, as is
// the free part.
//
// Its zero value is ready. It is a pure value (time comes from Load.At).
type Churn struct {
	// Span is the least time between two counter readings used for a rate;
	// zero means 1 s (counters move in whole requests, so shorter spans are
	// noise).
	Span time.Duration
	// Alpha is the weight of each new rate, 0..1; zero means 0.3.
	Alpha float64

	ref      scrape.Load // counters at the start of the current span
	haveRef  bool
	rate     float64 // smoothed allocated (miss and generated) tokens per second
	capacity float64 // tokens, from the latest load
	free     float64 // smoothed share of the capacity no request holds

	// The allocation history: at each kept span's end, the time and the
	// tokens allocated since the first (cum), the oldest overwritten once
	// historyLen are kept.
	hist     [historyLen]allocation
	histN    int // samples kept, ≤ historyLen
	histEnd  int // index after the newest
	cum      float64
	lastKept time.Time
	horizon  time.Duration // Horizon, as of the latest span
}

// allocation is one sample of the allocation history.
type allocation struct {
	at  int64 // Unix ns
	cum float64
}

// historyLen is the samples of allocation history a Churn keeps: spaced a
// hundredth of the horizon apart (at least a Span), they cover more than
// two horizons at 4 KB a replica.
const historyLen = 256

// Observe takes one scrape. Loads without a timestamp are ignored; a counter
// that went backwards (engine restart) restarts the measurement.
func (c *Churn) Observe(l scrape.Load) {
	if l.At.IsZero() {
		return
	}
	if l.NumBlocks > 0 && l.BlockSize > 0 {
		c.capacity = float64(l.NumBlocks) * float64(l.BlockSize)
	}
	if !c.haveRef || l.PrefixQueries < c.ref.PrefixQueries || l.PrefixHits < c.ref.PrefixHits ||
		l.GenerationTokens < c.ref.GenerationTokens {
		c.ref, c.haveRef = l, true
		return
	}
	span := c.Span
	if span <= 0 {
		span = time.Second
	}
	dt := l.At.Sub(c.ref.At)
	if dt < span {
		return
	}
	misses := (l.PrefixQueries - c.ref.PrefixQueries) - (l.PrefixHits - c.ref.PrefixHits)
	rate := (max(misses, 0) + (l.GenerationTokens - c.ref.GenerationTokens)) / dt.Seconds()
	free := 1 - min(max(l.KVUsage, 0), 1)
	if l.KVUsage != l.KVUsage { // NaN: say nothing of it
		free = 1
	}
	alpha := c.Alpha
	if alpha <= 0 || alpha > 1 {
		alpha = 0.3
	}
	if c.rate == 0 {
		c.rate, c.free = rate, free
	} else {
		c.rate = (1-alpha)*c.rate + alpha*rate
		c.free = (1-alpha)*c.free + alpha*free
	}
	c.keep(c.ref.At, l.At, rate*dt.Seconds(), span)
	c.ref = l
	c.horizon = c.estimate()
}

// keep adds the tokens allocated from `from` to at to the history, as a
// new sample when the newest is at least a hundredth of the horizon (and
// a span) old, else by moving the newest forward.
func (c *Churn) keep(from, at time.Time, allocated float64, span time.Duration) {
	if c.histN == 0 {
		c.push(allocation{at: from.UnixNano()})
	}
	c.cum += allocated
	gap := max(span, c.horizon/(historyLen/2))
	if c.histN > 1 && at.Sub(c.lastKept) < gap {
		c.hist[(c.histEnd+historyLen-1)%historyLen] = allocation{at: at.UnixNano(), cum: c.cum}
		return
	}
	c.lastKept = at
	c.push(allocation{at: at.UnixNano(), cum: c.cum})
}

func (c *Churn) push(a allocation) {
	c.hist[c.histEnd] = a
	c.histEnd = (c.histEnd + 1) % historyLen
	c.histN = min(c.histN+1, historyLen)
}

// Horizon returns the estimated eviction horizon; zero (unknown, no decay)
// until both a capacity and a positive miss rate have been seen.
//
// It is how long ago the engine began allocating the free part of its
// cache anew: the time back from the newest sample of the allocation
// history at which the tokens allocated since equal the free part. That
// is LRU's own definition, and it holds however the allocation rate
// swings, where the smoothed rate's quotient follows each burst and lull
// of a few seconds (on multi-tenant-context it ranged from one to eleven
// minutes on one replica). Before the history holds that much it is the
// quotient. It changes only when a span completes (Observe).
func (c *Churn) Horizon() time.Duration { return c.horizon }

// estimate computes Horizon.
func (c *Churn) estimate() time.Duration {
	if c.capacity <= 0 || c.rate <= 0 {
		return 0
	}
	if h, ok := c.fromHistory(); ok {
		return h
	}
	h := c.capacity * c.free / c.rate // seconds
	if h > (24 * time.Hour).Seconds() {
		return 24 * time.Hour
	}
	return time.Duration(h * float64(time.Second))
}

// fromHistory is Horizon from the allocation history, and whether the
// history reaches back that far.
func (c *Churn) fromHistory() (time.Duration, bool) {
	if c.histN < 2 {
		return 0, false
	}
	free := c.capacity * c.free
	newest := c.hist[(c.histEnd+historyLen-1)%historyLen]
	for k := 2; k <= c.histN; k++ {
		s := c.hist[(c.histEnd+historyLen-k)%historyLen]
		if newest.cum-s.cum < free {
			continue
		}
		// Between s and the next sample, allocation is taken as steady.
		next := c.hist[(c.histEnd+historyLen-k+1)%historyLen]
		over := (newest.cum - s.cum - free) / max(next.cum-s.cum, 1e-9)
		at := float64(s.at) + over*float64(next.at-s.at)
		return min(time.Duration(float64(newest.at)-at), 24*time.Hour), true
	}
	return 0, false
}

// MissRate returns the smoothed rate of allocated tokens (uncached prompt
// and generated), per second.
func (c *Churn) MissRate() float64 { return c.rate }

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
	tierRate float64 // smoothed tokens per second new to the CPU tier (rate less the tier's own loads)
	capacity float64 // tokens, from the latest load
	tier     float64 // tokens of the CPU tier, from the latest load
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
	tierH    time.Duration // TierHorizon, as of the latest span
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
		c.tier = float64(l.CPUBlocks) * float64(l.BlockSize)
	}
	if !c.haveRef || l.PrefixQueries < c.ref.PrefixQueries || l.PrefixHits < c.ref.PrefixHits ||
		l.GenerationTokens < c.ref.GenerationTokens || l.ExternalHits < c.ref.ExternalHits {
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
	generated := l.GenerationTokens - c.ref.GenerationTokens
	rate := (max(misses, 0) + generated) / dt.Seconds()
	// A block a connector served (loaded from the CPU tier) is a GPU miss
	// but nothing new to the tier.
	tierRate := (max(misses-(l.ExternalHits-c.ref.ExternalHits), 0) + generated) / dt.Seconds()
	free := 1 - min(max(l.KVUsage, 0), 1)
	if l.KVUsage != l.KVUsage { // NaN: say nothing of it
		free = 1
	}
	alpha := c.Alpha
	if alpha <= 0 || alpha > 1 {
		alpha = 0.3
	}
	if c.rate == 0 {
		c.rate, c.free, c.tierRate = rate, free, tierRate
	} else {
		c.rate = (1-alpha)*c.rate + alpha*rate
		c.free = (1-alpha)*c.free + alpha*free
		c.tierRate = (1-alpha)*c.tierRate + alpha*tierRate
	}
	c.keep(c.ref.At, l.At, rate*dt.Seconds(), span)
	c.ref = l
	c.horizon = c.estimate()
	c.tierH = c.estimateTier()
}

// keep adds the tokens allocated from `from` to at to the history, as a
// new sample when the newest is at least a hundredth of the longer
// horizon (and a span) old, else by moving the newest forward.
func (c *Churn) keep(from, at time.Time, allocated float64, span time.Duration) {
	if c.histN == 0 {
		c.push(allocation{at: from.UnixNano()})
	}
	c.cum += allocated
	gap := max(span, max(c.horizon, c.tierH)/(historyLen/2))
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

// TierHorizon returns how long an untouched block survives on the
// replica's CPU tier, zero without one (or before a miss rate is seen).
// The tier the engines keep (vLLM's CPU offloading, LMCache's local CPU
// backend) is written through: every block the GPU stores is copied to
// it, and it evicts its least recently used. Its slots are taken by the
// GPU's new blocks less those the tier itself served (the engine's
// external prefix-cache hits), and none is held by a running request, so
// a block survives there until the tier's whole capacity is taken anew:
// its capacity over that rate, smoothed. It is at least Horizon (a block
// still on the GPU is served from there).
func (c *Churn) TierHorizon() time.Duration { return c.tierH }

// estimate computes Horizon.
func (c *Churn) estimate() time.Duration { return c.survival(c.capacity * c.free) }

// estimateTier computes TierHorizon.
func (c *Churn) estimateTier() time.Duration {
	if c.tier <= 0 {
		return 0
	}
	if c.tierRate <= 0 {
		return 24 * time.Hour
	}
	return max(min(time.Duration(c.tier/c.tierRate*float64(time.Second)), 24*time.Hour), c.horizon)
}

// survival is how long ago the engine began allocating free tokens of
// slots anew: from the allocation history where it reaches back that
// far, else their quotient by the smoothed rate; zero before a capacity
// and a positive rate are seen.
func (c *Churn) survival(free float64) time.Duration {
	if c.capacity <= 0 || c.rate <= 0 {
		return 0
	}
	if h, ok := c.fromHistory(free); ok {
		return h
	}
	h := free / c.rate // seconds
	if h > (24 * time.Hour).Seconds() {
		return 24 * time.Hour
	}
	return time.Duration(h * float64(time.Second))
}

// fromHistory is the time back from the newest sample at which the tokens
// allocated since equal free, and whether the history reaches back that
// far.
func (c *Churn) fromHistory(free float64) (time.Duration, bool) {
	if c.histN < 2 {
		return 0, false
	}
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

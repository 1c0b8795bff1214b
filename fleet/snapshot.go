package fleet

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"kvrouter/route"
)

// Snapshot fills dst with the fleet as the policy sees it at now, in
// blocks of unit tokens (zero means Config.BlockSize), reusing
// dst.Replicas' backing array (so a caller that keeps one Snapshot per
// goroutine allocates nothing in steady state). LoadAge is now minus the
// last scrape's time; IndexBlocks is what the tracker attributes to each
// replica. A replica with no TTFT observation yet gets the geometric mean
// of the others' learned scales (priorScale).
func (f *Fleet) Snapshot(dst *route.Snapshot, now time.Time, unit int) {
	if unit <= 0 {
		unit = f.cfg.BlockSize
	}
	dst.BlockSize = unit
	d := divider(unit)
	f.mu.RLock()
	if cap(dst.Replicas) < len(f.reps) {
		dst.Replicas = make([]route.Replica, len(f.reps), f.cfg.MaxReplicas)
	}
	dst.Replicas = dst.Replicas[:len(f.reps)]
	prior := f.cal.prior(len(f.reps))
	for i, r := range f.reps {
		f.fill(&dst.Replicas[i], r, now, d, prior)
	}
	f.mu.RUnlock()
	f.tr.EachBlocks(len(dst.Replicas), func(r, n int) { dst.Replicas[r].IndexBlocks = n })
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

// fill writes one replica's view in blocks of d tokens; a replica without
// a TTFT observation gets prior as its scale, when prior is not zero.
func (f *Fleet) fill(out *route.Replica, r *replica, now time.Time, d divider, prior float64) {
	*out = route.Replica{
		ID:            r.id,
		Healthy:       r.healthy.Load(),
		InFlight:      int(r.inFlight.Load()),
		PrefillTokens: int(max(r.prefillTokens.Load(), 0)),
		Decoding:      int(r.decoding.Load()),
		DecodeBlocks:  int(d.div(max(r.decodeTokens.Load(), 0) + int64(d) - 1)),
	}
	p := r.pub.Load()
	if p.scraped {
		out.Scraped = true
		out.Running, out.Waiting, out.KVUsage = p.running, p.waiting, p.kvUsage
		out.LoadAge = max(now.Sub(p.loadAt), 0)
	}
	out.CacheBlocks, out.Rates = int(d.div(int64(p.capTokens))), p.rates
	if prior > 0 && !p.calibrated {
		out.Rates.Scale = prior
	}
	if f.needs.Window > 0 {
		r.mu.Lock()
		prefill, _ := r.recent.Sum(now, f.needs.Window)
		out.RecentPrefill = int(prefill)
		r.mu.Unlock()
	}
}

// calTotals sums the learned log scales of the calibrated replicas, so
// that a snapshot gives the uncalibrated ones their mean (priorScale)
// without a logarithm per replica. Without it, once one replica is
// calibrated (say to 0.3: the engines are faster than the preset), every
// uncalibrated one looks 3× slower and gets no traffic to calibrate on.
// mu guards sum and n; mean and count are what snapshots read.
type calTotals struct {
	mu    sync.Mutex
	sum   float64
	n     int
	mean  atomic.Uint64 // float64 bits of exp(sum/n)
	count atomic.Int64  // n
}

// update replaces a replica's contribution: was (old, in) before, now
// (now, calibrated).
func (c *calTotals) update(old float64, in bool, now float64, calibrated bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if in {
		c.sum -= old
		c.n--
	}
	if calibrated {
		c.sum += now
		c.n++
	}
	if c.n > 0 {
		c.mean.Store(math.Float64bits(math.Exp(c.sum / float64(c.n))))
	}
	c.count.Store(int64(c.n))
}

// prior returns the scale uncalibrated replicas of a fleet of total take:
// the calibrated ones' geometric mean, or zero when none or all are
// calibrated (nothing to give).
func (c *calTotals) prior(total int) float64 {
	if n := c.count.Load(); n == 0 || n >= int64(total) {
		return 0
	}
	return math.Float64frombits(c.mean.Load())
}

package fleet

import (
	"math"
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
	f.mu.RLock()
	if cap(dst.Replicas) < len(f.reps) {
		dst.Replicas = make([]route.Replica, len(f.reps), f.cfg.MaxReplicas)
	}
	dst.Replicas = dst.Replicas[:len(f.reps)]
	logSum, calibrated := 0.0, 0
	for i, r := range f.reps {
		if f.fill(&dst.Replicas[i], r, now, unit) {
			logSum += math.Log(max(dst.Replicas[i].Rates.Scale, 1e-9))
			calibrated++
		}
	}
	if calibrated > 0 && calibrated < len(f.reps) {
		priorScale(dst, f.reps, math.Exp(logSum/float64(calibrated)))
	}
	f.mu.RUnlock()
	f.tr.EachBlocks(len(dst.Replicas), func(r, n int) { dst.Replicas[r].IndexBlocks = n })
}

// fill writes one replica's view in blocks of unit tokens and reports
// whether its scale is calibrated.
func (f *Fleet) fill(out *route.Replica, r *replica, now time.Time, unit int) bool {
	*out = route.Replica{
		ID:            r.id,
		Healthy:       r.healthy.Load(),
		InFlight:      int(r.inFlight.Load()),
		PrefillTokens: int(max(r.prefillTokens.Load(), 0)),
		Decoding:      int(r.decoding.Load()),
		DecodeBlocks:  int((max(r.decodeTokens.Load(), 0) + int64(unit) - 1) / int64(unit)),
	}
	p := r.pub.Load()
	if p.scraped {
		out.Scraped = true
		out.Running, out.Waiting, out.KVUsage = p.running, p.waiting, p.kvUsage
		out.LoadAge = max(now.Sub(p.loadAt), 0)
	}
	out.CacheBlocks, out.Rates = p.capTokens/unit, p.rates
	if f.needs.Window > 0 {
		r.mu.Lock()
		prefill, _ := r.recent.Sum(now, f.needs.Window)
		out.RecentPrefill = int(prefill)
		r.mu.Unlock()
	}
	return p.calibrated
}

// priorScale gives the replicas of s that have no TTFT observation yet
// the mean scale of the others (their geometric mean). Without it, once
// one replica is calibrated (say to 0.3: the engines are faster than the
// preset), every uncalibrated one looks 3× slower and gets no traffic to
// calibrate on.
func priorScale(s *route.Snapshot, reps []*replica, mean float64) {
	for i, r := range reps {
		if !r.pub.Load().calibrated {
			s.Replicas[i].Rates.Scale = mean
		}
	}
}

package fleet

import (
	"time"

	"kvrouter/route"
)

// Snapshot fills dst with the fleet as the policy sees it at now, reusing
// dst.Replicas' backing array (so a caller that keeps one Snapshot per
// goroutine allocates nothing in steady state). LoadAge is now minus the
// last scrape's time. IndexBlocks is left zero for the residency index to
// fill.
func (f *Fleet) Snapshot(dst *route.Snapshot, now time.Time) {
	dst.BlockSize = f.blockSize()
	f.mu.RLock()
	defer f.mu.RUnlock()
	if cap(dst.Replicas) < len(f.reps) {
		dst.Replicas = make([]route.Replica, len(f.reps))
	}
	dst.Replicas = dst.Replicas[:len(f.reps)]
	for i, r := range f.reps {
		f.fill(&dst.Replicas[i], r, now)
	}
}

// fill writes one replica's view.
func (f *Fleet) fill(out *route.Replica, r *replica, now time.Time) {
	*out = route.Replica{
		ID:            r.id,
		Healthy:       r.healthy.Load(),
		InFlight:      int(r.inFlight.Load()),
		PrefillTokens: int(max(r.prefillTokens.Load(), 0)),
		Decoding:      int(r.decoding.Load()),
		DecodeBlocks:  int(r.decodeBlocks.Load()),
	}
	p := r.pub.Load()
	if p.scraped {
		out.Scraped = true
		out.Running, out.Waiting, out.KVUsage = p.running, p.waiting, p.kvUsage
		out.LoadAge = max(now.Sub(p.loadAt), 0)
	}
	out.CacheBlocks, out.Rates = p.cacheBlocks, p.rates
	if f.cfg.Window > 0 {
		r.mu.Lock()
		out.RecentPrefill = int(r.recent.total(now, f.cfg.Window))
		r.mu.Unlock()
	}
}

// View is a read-only copy of the fleet for dashboards and debugging.
type View struct {
	// At is the time the view was taken for.
	At time.Time
	// Replicas is in snapshot order.
	Replicas []ReplicaView
	// Sessions is the number of bound sessions.
	Sessions int
}

// ReplicaView is one replica in a View.
type ReplicaView struct {
	ID      string
	Healthy bool
	// InFlight, PrefillTokens, Decoding and DecodeBlocks are the router's
	// own counts (see route.Replica).
	InFlight, PrefillTokens, Decoding, DecodeBlocks int
	// Running, Waiting and KVUsage (0..1) are the engine's, from the last
	// scrape; Scraped is false if none succeeded, LoadAge is its age.
	Running, Waiting int
	KVUsage          float64
	Scraped          bool
	LoadAge          time.Duration
	// CacheBlocks is the KV capacity in snapshot blocks; zero if unknown.
	CacheBlocks int
	// Sessions is the number of sessions bound here.
	Sessions int
	// Completed and Failed count finished tickets.
	Completed, Failed int64
	// PredictedCached and ActualCached total, over completed requests with
	// a reported usage, the cached prompt tokens the policy predicted and
	// the engine reported.
	PredictedCached, ActualCached int64
	// PromptTokens and UsageCached total the prompt and cached tokens of
	// the completed requests whose usage reported both; UsageCached /
	// PromptTokens is the replica's actual prefix hit rate.
	PromptTokens, UsageCached int64
	// Scale is the learned TTFT correction (route.Rates.Scale), Horizon the
	// estimated eviction horizon (zero: unknown).
	Scale   float64
	Horizon time.Duration
}

// View returns a copy of the fleet's state at now.
func (f *Fleet) View(now time.Time) View {
	counts := f.sessionCounts()
	var s route.Snapshot
	f.mu.RLock()
	reps := append([]*replica(nil), f.reps...)
	f.mu.RUnlock()
	v := View{At: now, Replicas: make([]ReplicaView, len(reps))}
	s.Replicas = make([]route.Replica, 1)
	for i, r := range reps {
		f.fill(&s.Replicas[0], r, now)
		p := &s.Replicas[0]
		v.Replicas[i] = ReplicaView{
			ID: p.ID, Healthy: p.Healthy,
			InFlight: p.InFlight, PrefillTokens: p.PrefillTokens, Decoding: p.Decoding, DecodeBlocks: p.DecodeBlocks,
			Running: p.Running, Waiting: p.Waiting, KVUsage: p.KVUsage, Scraped: p.Scraped, LoadAge: p.LoadAge,
			CacheBlocks:     p.CacheBlocks,
			Sessions:        counts[r],
			Completed:       r.completed.Load(),
			Failed:          r.failed.Load(),
			PredictedCached: r.predictedCached.Load(),
			ActualCached:    r.actualCached.Load(),
			PromptTokens:    r.promptTokens.Load(),
			UsageCached:     r.usageCached.Load(),
			Scale:           p.Rates.Scale,
			Horizon:         p.Rates.Horizon,
		}
		v.Sessions += counts[r]
	}
	return v
}

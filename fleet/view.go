package fleet

import (
	"time"

	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/view"
)

// View returns the fleet's part of a view at now: every replica's health,
// models, the router's counts, the last scrape, residency, sessions,
// feedback totals and calibration. The caller adds what it knows beside
// (the policy's name, scrape errors, KV-event streams).
func (f *Fleet) View(now time.Time) view.Fleet {
	var s route.Snapshot
	f.Snapshot(&s, now, 0)
	counts := f.sessionCounts(len(s.Replicas))
	f.mu.RLock()
	reps := append([]*replica(nil), f.reps...)
	f.mu.RUnlock()
	v := view.Fleet{At: now, Index: f.IndexMode(-1), Replicas: make([]view.Replica, 0, len(s.Replicas))}
	for i, p := range s.Replicas {
		r := reps[i]
		member := r.member.Load()
		if member == memberRemoved {
			continue
		}
		held, capacity := f.tr.Blocks(i)
		models, known := f.Models(r.id)
		bs := f.tr.BlockSize(i)
		rv := view.Replica{
			ID: p.ID, Healthy: r.healthy.Load(), Draining: member == memberDraining, ModelsKnown: known,
			InFlight: p.InFlight, PrefillTokens: p.PrefillTokens, Decoding: p.Decoding, DecodeBlocks: p.DecodeBlocks,
			Running: p.Running, Waiting: p.Waiting, KVUsage: p.KVUsage, Scraped: p.Scraped, LoadAge: p.LoadAge,
			BlockSize: bs, IndexBlocks: held, IndexCapacity: capacity, IndexMode: f.IndexMode(i),
			Sessions:        counts[i],
			Completed:       r.completed.Load(),
			Failed:          r.failed.Load(),
			PromptTokens:    r.promptTokens.Load(),
			ActualCached:    r.actualCached.Load(),
			PredictedCached: r.predictedCached.Load(),
			Scale:           p.Rates.Scale,
			DecodeScale:     p.Rates.DecodeScale,
			Spread:          p.Rates.Spread,
			DecodeSpread:    p.Rates.DecodeSpread,
			Horizon:         p.Rates.Horizon,
			TierHorizon:     p.Rates.TierHorizon,
			Displaced:       p.Rates.Displaced,
			MaxSeqs:         p.Rates.MaxSeqs,
			MaxSeqsSource:   r.maxSeqsSource(),
		}
		if bs > 0 {
			rv.CacheBlocks = r.pub.Load().capTokens / bs
		}
		for _, m := range models {
			rv.Models = append(rv.Models, view.Model{ID: m.ID, Parent: m.Parent})
		}
		v.Replicas = append(v.Replicas, rv)
		v.Sessions += counts[i]
	}
	return v
}

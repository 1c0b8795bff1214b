package proxy

import (
	"time"

	"kvrouter/dashboard"
)

// dashSource is the dashboard's view of the router (dashboard.Source):
// View and Decisions converted field by field. The dashboard does not
// import the proxy; the proxy mounts the dashboard at /ui/ with it.
type dashSource struct{ rt *Router }

// Fleet implements dashboard.Source.
func (s dashSource) Fleet(now time.Time) dashboard.Fleet {
	v := s.rt.View(now)
	f := dashboard.Fleet{
		At: v.At, Policy: v.Policy, Index: v.Index, Sessions: v.Sessions, Decisions: v.Decisions,
		Replicas: make([]dashboard.Replica, len(v.Replicas)),
	}
	for i := range v.Replicas {
		f.Replicas[i] = dashReplica(&v.Replicas[i])
	}
	return f
}

// dashReplica converts one replica. The dashboard's actual hit rate is
// ActualCached / PromptTokens, so both come from the fleet's totals over
// the requests whose usage reported prompt and cached tokens
// (UsageCached, PromptTokens); the fleet's ActualCached also counts
// requests that reported cached tokens only.
func dashReplica(r *ReplicaView) dashboard.Replica {
	d := dashboard.Replica{
		ID: r.ID, Healthy: r.Healthy,
		InFlight: r.InFlight, PrefillTokens: r.PrefillTokens, Decoding: r.Decoding, DecodeBlocks: r.DecodeBlocks,
		Running: r.Running, Waiting: r.Waiting, KVUsage: r.KVUsage, Scraped: r.Scraped, LoadAge: r.LoadAge,
		ScrapeErrors: r.ScrapeErrors, ScrapeError: r.ScrapeError,
		CacheBlocks: r.CacheBlocks, IndexBlocks: r.IndexBlocks, Sessions: r.Sessions,
		Completed: r.Completed, Failed: r.Failed,
		PredictedCached: r.PredictedCached, ActualCached: r.UsageCached, PromptTokens: r.PromptTokens,
		Scale: r.Scale, Horizon: r.Horizon,
	}
	if r.URL != r.ID {
		d.URL = r.URL
	}
	if k := r.KVEvents; k != nil {
		d.Events = &dashboard.Events{
			Connected: k.Connected, LastEvent: k.LastEventAge,
			Gaps: int64(k.Gaps), Replays: int64(k.Replays), Resets: int64(k.Resets),
			Fallback: k.Fallback,
		}
	}
	return d
}

// Decisions implements dashboard.Source.
func (s dashSource) Decisions(n int) []dashboard.Decision {
	recs := s.rt.Decisions(n)
	out := make([]dashboard.Decision, len(recs))
	for i := range recs {
		r := &recs[i]
		out[i] = dashboard.Decision{
			ID: r.ID, At: r.At, Session: r.Session, Policy: r.Policy, Model: r.Model,
			Tokens: r.Tokens, Blocks: r.Blocks, Replica: r.Replica, Reason: r.Reason, Failed: r.Failed,
			PredictedCached: r.PredictedCached, ActualCached: r.ActualCached, PromptTokens: r.PromptTokens,
			PredictedTTFTMS: r.PredictedTTFTMS, DecideMS: r.DecideMS, TTFTMS: r.TTFTMS, E2EMS: r.E2EMS,
			Status: r.Status, Outcome: r.Outcome, PrunedCandidates: r.PrunedCandidates,
			Candidates: make([]dashboard.Candidate, len(r.Candidates)),
		}
		for j, c := range r.Candidates {
			out[i].Candidates[j] = dashboard.Candidate(c)
		}
	}
	return out
}

var _ dashboard.Source = dashSource{}

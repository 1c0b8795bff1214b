package dashboard

import (
	"time"

	"github.com/kvrouter/kvrouter/view"
)

// fleetJSON is the body of /ui/api/fleet (see API.md): the Source's Fleet
// with durations in milliseconds, hit rates divided out and replicas summed
// into totals, so the page only draws.
type fleetJSON struct {
	At        time.Time     `json:"at"`
	Policy    string        `json:"policy"`
	Index     string        `json:"index,omitempty"`
	Hash      string        `json:"hash,omitempty"`
	Sessions  int           `json:"sessions"`
	Decisions uint64        `json:"decisions"`
	Totals    totalsJSON    `json:"totals"`
	Replicas  []replicaJSON `json:"replicas"`
}

// totalsJSON sums the replicas; Requests and RequestsFailed are the
// router's count of client requests (view.Fleet), Completed and Failed
// the replicas' attempts.
type totalsJSON struct {
	Requests        int64    `json:"requests"`
	RequestsFailed  int64    `json:"requests_failed"`
	Replicas        int      `json:"replicas"`
	Healthy         int      `json:"healthy"`
	InFlight        int      `json:"in_flight"`
	PrefillTokens   int      `json:"prefill_tokens"`
	Running         int      `json:"running"`
	Waiting         int      `json:"waiting"`
	Completed       int64    `json:"completed"`
	Failed          int64    `json:"failed"`
	PredictedCached int64    `json:"predicted_cached_tokens"`
	ActualCached    int64    `json:"actual_cached_tokens"`
	PromptTokens    int64    `json:"prompt_tokens"`
	HitPredicted    *float64 `json:"hit_rate_predicted"`
	HitActual       *float64 `json:"hit_rate_actual"`
}

// replicaJSON is one replica.
type replicaJSON struct {
	ID              string      `json:"id"`
	Healthy         bool        `json:"healthy"`
	Draining        bool        `json:"draining"`
	Models          []modelJSON `json:"models"`
	ModelsKnown     bool        `json:"models_known"`
	InFlight        int         `json:"in_flight"`
	PrefillTokens   int         `json:"prefill_tokens"`
	Decoding        int         `json:"decoding"`
	DecodeBlocks    int         `json:"decode_blocks"`
	Scraped         bool        `json:"scraped"`
	Running         int         `json:"running"`
	Waiting         int         `json:"waiting"`
	KVUsage         float64     `json:"kv_usage"`
	LoadAgeMS       *float64    `json:"load_age_ms"`
	ScrapeErrors    int         `json:"scrape_errors"`
	ScrapeError     string      `json:"scrape_error,omitempty"`
	Engine          string      `json:"engine,omitempty"`
	BlockSize       int         `json:"block_size"`
	CacheBlocks     int         `json:"cache_blocks"`
	IndexBlocks     int         `json:"index_blocks"`
	IndexCapacity   int         `json:"index_capacity"`
	IndexMode       string      `json:"index_mode"`
	Sessions        int         `json:"sessions"`
	Completed       int64       `json:"completed"`
	Failed          int64       `json:"failed"`
	PredictedCached int64       `json:"predicted_cached_tokens"`
	ActualCached    int64       `json:"actual_cached_tokens"`
	PromptTokens    int64       `json:"prompt_tokens"`
	HitPredicted    *float64    `json:"hit_rate_predicted"`
	HitActual       *float64    `json:"hit_rate_actual"`
	Scale           float64     `json:"scale"`
	DecodeScale     float64     `json:"decode_scale"`
	Spread          float64     `json:"spread"`
	DecodeSpread    float64     `json:"decode_spread"`
	HorizonMS       float64     `json:"horizon_ms"`
	TierHorizonMS   float64     `json:"tier_horizon_ms,omitempty"`
	Displaced       float64     `json:"displaced"`
	MaxSeqs         int         `json:"max_num_seqs"`
	MaxSeqsSource   string      `json:"max_num_seqs_source,omitempty"`
	Events          *eventsJSON `json:"events,omitempty"`
}

// modelJSON is one model a replica serves.
type modelJSON struct {
	ID     string `json:"id"`
	Parent string `json:"parent,omitempty"`
}

// eventsJSON is one replica's KV-event stream health.
type eventsJSON struct {
	Connected      bool     `json:"connected"`
	Stale          bool     `json:"stale"`
	LastEventAgeMS *float64 `json:"last_event_age_ms"`
	Events         uint64   `json:"events"`
	Gaps           uint64   `json:"gaps"`
	Replays        uint64   `json:"replays"`
	Resets         uint64   `json:"resets"`
	Orphans        uint64   `json:"orphans"`
	Blocks         int      `json:"blocks"`
	Fallback       bool     `json:"fallback"`
}

// fleetOf converts f for the API.
func fleetOf(f view.Fleet) fleetJSON {
	out := fleetJSON{At: f.At, Policy: f.Policy, Index: f.Index, Hash: f.Hash, Sessions: f.Sessions, Decisions: f.Decisions, Replicas: make([]replicaJSON, len(f.Replicas))}
	t := &out.Totals
	t.Requests, t.RequestsFailed = f.Requests, f.RequestsFailed
	for i, r := range f.Replicas {
		out.Replicas[i] = replicaOf(r)
		t.Replicas++
		if r.Healthy {
			t.Healthy++
		}
		t.InFlight += r.InFlight
		t.PrefillTokens += r.PrefillTokens
		t.Running += r.Running
		t.Waiting += r.Waiting
		t.Completed += r.Completed
		t.Failed += r.Failed
		t.PredictedCached += r.PredictedCached
		t.ActualCached += r.ActualCached
		t.PromptTokens += r.PromptTokens
	}
	t.HitPredicted = ratio(t.PredictedCached, t.PromptTokens)
	t.HitActual = ratio(t.ActualCached, t.PromptTokens)
	return out
}

// replicaOf converts r for the API.
func replicaOf(r view.Replica) replicaJSON {
	out := replicaJSON{
		ID: r.ID, Healthy: r.Healthy, Draining: r.Draining, Models: []modelJSON{}, ModelsKnown: r.ModelsKnown,
		InFlight: r.InFlight, PrefillTokens: r.PrefillTokens, Decoding: r.Decoding, DecodeBlocks: r.DecodeBlocks,
		Scraped: r.Scraped, ScrapeErrors: r.ScrapeErrors, ScrapeError: r.ScrapeError, Engine: r.Engine, Running: r.Running, Waiting: r.Waiting, KVUsage: r.KVUsage,
		BlockSize: r.BlockSize, CacheBlocks: r.CacheBlocks, IndexBlocks: r.IndexBlocks,
		IndexCapacity: r.IndexCapacity, IndexMode: r.IndexMode, Sessions: r.Sessions,
		Completed: r.Completed, Failed: r.Failed,
		PredictedCached: r.PredictedCached, ActualCached: r.ActualCached, PromptTokens: r.PromptTokens,
		HitPredicted: ratio(r.PredictedCached, r.PromptTokens),
		HitActual:    ratio(r.ActualCached, r.PromptTokens),
		MaxSeqs:      r.MaxSeqs, MaxSeqsSource: r.MaxSeqsSource,
		Scale: r.Scale, DecodeScale: r.DecodeScale, Spread: r.Spread, DecodeSpread: r.DecodeSpread, HorizonMS: ms(r.Horizon), TierHorizonMS: ms(r.TierHorizon), Displaced: r.Displaced,
	}
	for _, m := range r.Models {
		out.Models = append(out.Models, modelJSON{ID: m.ID, Parent: m.Parent})
	}
	if r.Scraped {
		age := ms(r.LoadAge)
		out.LoadAgeMS = &age
	}
	if e := r.Events; e != nil {
		out.Events = &eventsJSON{Connected: e.Connected, Stale: e.Stale, Events: e.Events, Gaps: e.Gaps, Replays: e.Replays,
			Resets: e.Resets, Orphans: e.Orphans, Blocks: e.Blocks, Fallback: e.Fallback}
		if e.LastEvent >= 0 {
			age := ms(e.LastEvent)
			out.Events.LastEventAgeMS = &age
		}
	}
	return out
}

// ratio is num/den, or nil when den is not positive.
func ratio(num, den int64) *float64 {
	if den <= 0 {
		return nil
	}
	v := float64(num) / float64(den)
	return &v
}

// ms converts d to milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

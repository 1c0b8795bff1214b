// Package dashboard is the router's live web page: an http.Handler that
// serves GET /ui (an embedded HTML page, CSS and a small vanilla script; no
// CDN, works offline) and a small JSON API under /ui/api that the page polls
// once a second. It is a view of what a Source returns and holds no routing
// logic: the handler only converts units and sums replicas into totals, the
// page only draws.
//
// The JSON API is documented field by field in API.md.
package dashboard

import "time"

// Source is what the dashboard shows. The router implements it through a
// small adapter (the dashboard does not import the proxy, the proxy imports
// the dashboard to mount it). Both methods are called from HTTP handlers
// and must be safe for concurrent use; they return copies the dashboard may
// keep.
type Source interface {
	// Fleet returns the fleet as it is at now.
	Fleet(now time.Time) Fleet
	// Decisions returns up to n recent routing decisions, newest first.
	Decisions(n int) []Decision
}

// Fleet is one picture of the router and its replicas.
type Fleet struct {
	// At is the time the picture was taken for.
	At time.Time
	// Policy is the routing policy's name, e.g. "kv-aware".
	Policy string
	// Index is the residency feed the policy reads: "precise",
	// "approximate" or "none"; empty means not reported.
	Index string
	// Sessions is the number of bound sessions, router-wide.
	Sessions int
	// Decisions is the number of routing decisions made since start.
	Decisions uint64
	// Replicas is in the router's replica order.
	Replicas []Replica
}

// Replica is one replica in a Fleet. It follows fleet.ReplicaView, plus
// the fields only the proxy knows (URL, IndexBlocks, PromptTokens, Events).
type Replica struct {
	// ID names the replica (the proxy uses its base URL); URL is its base
	// URL when different from ID, else empty.
	ID, URL string
	// Healthy is the health checker's verdict.
	Healthy bool
	// InFlight is the router's own count of requests sent and not finished;
	// PrefillTokens the prompt tokens of those still in prefill (net of
	// predicted cached tokens); Decoding the requests past their first
	// token; DecodeBlocks their KV footprint in index blocks.
	InFlight, PrefillTokens, Decoding, DecodeBlocks int
	// Running and Waiting are the engine's scheduler queues and KVUsage its
	// KV-cache usage (0..1), from the last scrape. Scraped is false if no
	// scrape succeeded yet; LoadAge is the last scrape's age.
	Running, Waiting int
	KVUsage          float64
	Scraped          bool
	LoadAge          time.Duration
	// ScrapeErrors is the number of consecutive failed scrapes and
	// ScrapeError the last one's message (empty after a success).
	ScrapeErrors int
	ScrapeError  string
	// CacheBlocks is the KV capacity in index blocks (zero: unknown);
	// IndexBlocks the blocks the residency index believes are resident.
	CacheBlocks, IndexBlocks int
	// Sessions is the number of sessions bound to this replica.
	Sessions int
	// Completed and Failed count finished requests.
	Completed, Failed int64
	// PromptTokens and ActualCached total the engine's reported
	// usage.prompt_tokens and usage.prompt_tokens_details.cached_tokens
	// over the completed requests whose usage reported both, so that
	// ActualCached / PromptTokens is the replica's actual hit rate;
	// PredictedCached totals the cached prompt tokens the policy predicted
	// for the completed requests that reported cached tokens (the same
	// requests, for any engine that reports prompt_tokens). PromptTokens
	// zero means unknown, and then the hit rates are not shown.
	PredictedCached, ActualCached, PromptTokens int64
	// Scale is the learned TTFT correction factor (1: the cost model was
	// right; zero: unknown); Horizon the estimated eviction horizon (zero:
	// unknown).
	Scale   float64
	Horizon time.Duration
	// Events is the replica's KV-event stream health in precise mode; nil
	// when the router does not consume KV events.
	Events *Events
}

// Events is the health of one replica's KV-event stream.
type Events struct {
	// Connected is true while the subscriber is connected.
	Connected bool
	// LastEvent is the age of the last event received; negative means none
	// yet.
	LastEvent time.Duration
	// Gaps counts sequence gaps seen, Replays the replays requested to fill
	// them, Resets the index resets for this replica (e.g. after an engine
	// restart or an unfillable gap).
	Gaps, Replays, Resets int64
	// Fallback is true while the router routes this replica with the
	// approximate index because the stream is not trustworthy.
	Fallback bool
}

// Decision is one routing decision and what came of it. Its fields and
// JSON names follow the proxy's /debug/decisions records; durations are in
// milliseconds.
type Decision struct {
	// ID is the request id the router assigned; At its arrival time.
	ID string    `json:"id"`
	At time.Time `json:"at"`
	// Session is the session id the request was bound by (empty: none).
	Session string `json:"session,omitempty"`
	Policy  string `json:"policy,omitempty"`
	Model   string `json:"model,omitempty"`
	// Tokens is the router's estimate of the prompt length; Blocks its full
	// prefix blocks.
	Tokens int `json:"tokens"`
	Blocks int `json:"blocks"`
	// Candidates are the replicas the policy costed (empty for policies
	// without cost terms).
	Candidates []Candidate `json:"candidates"`
	// PrunedCandidates counts the candidates kv-aware proved could not win
	// without pricing them in full, left out of Candidates.
	PrunedCandidates int `json:"pruned_candidates,omitempty"`
	// Replica is the chosen replica (empty: rejected); Reason the policy's
	// explanation; Failed the replicas tried first that failed before the
	// first byte.
	Replica string   `json:"replica"`
	Reason  string   `json:"reason"`
	Failed  []string `json:"failed,omitempty"`
	// PredictedCached is the policy's predicted cached prompt tokens;
	// ActualCached the engine's reported cached tokens and PromptTokens its
	// prompt tokens (-1: not reported, or not yet).
	PredictedCached int `json:"predicted_cached_tokens"`
	ActualCached    int `json:"actual_cached_tokens"`
	PromptTokens    int `json:"prompt_tokens"`
	// PredictedTTFTMS is the chosen candidate's predicted time to first
	// token (0: not predicted); TTFTMS the observed arrival to first byte
	// (0: not yet);
	// E2EMS arrival to the end of the response (0 while in flight).
	PredictedTTFTMS float64 `json:"predicted_ttft_ms,omitempty"`
	// DecideMS is the time the router spent matching and picking.
	DecideMS float64 `json:"decide_ms"`
	TTFTMS   float64 `json:"ttft_ms"`
	E2EMS    float64 `json:"e2e_ms"`
	// Status is the HTTP status sent to the client (0: not yet).
	Status int `json:"status"`
	// Outcome is in-flight, ok, canceled, upstream-error or error.
	Outcome string `json:"outcome"`
}

// Candidate is one replica's cost terms in a decision, in milliseconds of
// predicted time to first token.
type Candidate struct {
	// Replica names the replica; Matched is the prompt tokens the index
	// predicted cached there.
	Replica string `json:"replica"`
	Matched int    `json:"matched_tokens"`
	// WaitMS is the queueing delay, PrefillMS the prefill of the uncached
	// tokens, DecodeMS the slowdown from co-running decodes, MemoryMS the
	// penalty for KV-cache pressure, TotalMS the cost the policy minimised.
	WaitMS    float64 `json:"wait_ms"`
	PrefillMS float64 `json:"prefill_ms"`
	DecodeMS  float64 `json:"decode_ms"`
	MemoryMS  float64 `json:"memory_ms"`
	TotalMS   float64 `json:"total_ms"`
}

// Package view is the router's state as people and tools read it: one
// model that the dashboard (/ui, package dashboard) and /debug/decisions
// both serve. Package fleet fills what it owns of a Fleet, the proxy adds
// what only the data plane knows (scrape errors, KV-event streams, the
// policy and hashing modes) and records the Decisions. The types are plain
// copies: a reader may keep and read them without locks.
package view

import "time"

// Fleet is one picture of the router and its replicas.
type Fleet struct {
	// At is the time the picture was taken for.
	At time.Time
	// Policy is the routing policy's name, e.g. "kv-aware"; Index the
	// residency feed it reads: "precise" (KV events followed; a replica
	// may still fall back, see Replica.IndexMode), "approximate" or
	// "none"; Hash the request hashing, "text" or "tokens".
	Policy, Index, Hash string
	// Sessions is the number of bound sessions, router-wide.
	Sessions int
	// Decisions is the number of routing decisions made since start.
	Decisions uint64
	// Requests counts the completion requests that finished since start
	// as their clients saw them, after any retry on another replica (one
	// the client canceled is not counted); RequestsFailed those of them
	// that failed. Replica.Completed and Failed count attempts instead: a
	// request retried after a failure is one failed attempt and one
	// completed, but one request that succeeded.
	Requests, RequestsFailed int64
	// Replicas is in the router's replica order.
	Replicas []Replica
}

// Replica is one replica in a Fleet.
type Replica struct {
	// ID names the replica (the live router uses its base URL).
	ID string
	// Healthy is the health checker's verdict.
	Healthy bool
	// Draining says the replica takes no new requests while those in
	// flight finish (the admin API's drain, or a removal by discovery).
	Draining bool
	// Models are the models the replica serves; ModelsKnown is false
	// while they are not known (it is then a candidate for any model).
	Models      []Model
	ModelsKnown bool
	// InFlight is the router's own count of requests sent and not
	// finished; PrefillTokens the prompt tokens of those still in prefill
	// (net of predicted cached tokens); Decoding the requests past their
	// first token; DecodeBlocks their KV footprint in blocks of BlockSize.
	InFlight, PrefillTokens, Decoding, DecodeBlocks int
	// Running and Waiting are the engine's scheduler queues and KVUsage
	// its KV-cache usage (0..1), from the last scrape. Scraped is false if
	// no scrape succeeded yet; LoadAge is the last scrape's age.
	Running, Waiting int
	KVUsage          float64
	Scraped          bool
	LoadAge          time.Duration
	// ScrapeErrors is the number of consecutive failed scrapes and
	// ScrapeError the last one's message (empty after a success).
	ScrapeErrors int
	ScrapeError  string
	// Engine is the engine the replica's metrics show (vllm, sglang,
	// llamacpp), or declared; empty when its last page had no family the
	// router reads (its load then reads as idle: shown as a warning).
	Engine string
	// BlockSize is the engine's tokens per block (zero: unknown);
	// CacheBlocks its KV capacity in those blocks (zero: unknown).
	BlockSize, CacheBlocks int
	// IndexBlocks is the blocks the residency tracker believes resident,
	// IndexCapacity the bound of the share they count against; IndexMode
	// the feed the replica is matched against now: "precise",
	// "approximate" (its event stream is missing or stale, or not
	// followed) or "none".
	IndexBlocks, IndexCapacity int
	IndexMode                  string
	// Sessions is the number of sessions bound to this replica.
	Sessions int
	// Completed and Failed count finished requests.
	Completed, Failed int64
	// PromptTokens, ActualCached and PredictedCached total, over the
	// completed requests whose usage reported prompt and cached tokens,
	// the engine's usage.prompt_tokens, its
	// usage.prompt_tokens_details.cached_tokens and the cached tokens the
	// policy predicted (in the engine's tokens: the predicted share of the
	// router's estimate of the prompt), so that ActualCached /
	// PromptTokens is the replica's hit rate and PredictedCached /
	// PromptTokens the one the router expected. PromptTokens zero means
	// unknown.
	PromptTokens, ActualCached, PredictedCached int64
	// Scale is the learned TTFT correction factor (1: the cost model was
	// right; zero: unknown), DecodeScale the learned inter-token latency
	// one (the same); Horizon the estimated eviction horizon (zero:
	// unknown); Displaced the learned share of its evicted tokens that
	// requests asked for again (route.Rates.Displaced).
	Scale, DecodeScale, Displaced float64
	Horizon                       time.Duration
	// Spread and DecodeSpread are the spreads of the TTFT and
	// inter-token latency predictions' errors that kv-aware's miss
	// probabilities take (route.Rates.Spread, DecodeSpread): learned, or
	// the fleet's for a replica not yet observed; zero: the prior,
	// route.PriorSpread.
	Spread, DecodeSpread float64
	// TierHorizon is the eviction horizon of the replica's CPU tier
	// (route.Rates.TierHorizon); zero without one.
	TierHorizon time.Duration
	// MaxSeqs is the engine's max_num_seqs the policy prices seats with
	// (route.Rates.MaxSeqs), and MaxSeqsSource where it comes from:
	// "configured" (the backend's max_num_seqs=), "learned" (its metrics)
	// or "preset".
	MaxSeqs       int
	MaxSeqsSource string
	// Events is the replica's KV-event stream; nil when the router does
	// not consume KV events.
	Events *Events
}

// Model is one model a replica serves.
type Model struct {
	// ID is the name requests use; Parent the base model of a LoRA
	// adapter, empty for a base model.
	ID, Parent string
}

// Events is the health of one replica's KV-event stream.
type Events struct {
	// Followed is true when the router subscribes to the replica's events.
	Followed bool
	// Connected is true while the subscriber is connected; Stale when the
	// router expected events that did not come.
	Connected, Stale bool
	// Fallback is true while the router routes this replica with the
	// approximate index because the stream is not trustworthy.
	Fallback bool
	// LastEvent is the age of the last event batch; negative means none
	// yet.
	LastEvent time.Duration
	// Events counts events applied; Gaps the sequence gaps seen, Replays
	// the replays that filled them, Resets the index resets for this
	// replica (an engine restart, an unfillable gap), Orphans the stored
	// blocks whose parent was unknown, DecodeErrors the undecodable
	// messages.
	Events, Gaps, Replays, Resets, Orphans, DecodeErrors uint64
	// Blocks is the engine blocks the stream says the replica holds.
	Blocks int
}

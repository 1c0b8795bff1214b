package view

import "time"

// Outcomes of a request, as Decision.Outcome names them.
const (
	// OutcomeInFlight: the response has not ended yet.
	OutcomeInFlight = "in-flight"
	// OutcomeOK: the response ended normally: a complete answer, or a
	// stream that delivered its end ([DONE] or a finish_reason), whatever
	// the client did next; also an engine's own 4xx answer.
	OutcomeOK = "ok"
	// OutcomeCanceled: the client went away before the response ended.
	OutcomeCanceled = "canceled"
	// OutcomeUpstreamError: the replica answered 5xx, could not be
	// reached, or cut the stream before its end.
	OutcomeUpstreamError = "upstream_error"
	// OutcomeError: the router answered with an error of its own.
	OutcomeError = "error"
)

// Decision is one routing decision and what came of it, as
// /debug/decisions and the dashboard show it. It is written when the
// request is routed (Outcome in-flight) and completed when its response
// ends. Durations are in milliseconds.
type Decision struct {
	// ID is the request id the router assigned; At its arrival time.
	ID string    `json:"id"`
	At time.Time `json:"at"`
	// Session is the session id the request was bound by, and
	// SessionSource where it came from: header, user or content.
	Session       string `json:"session,omitempty"`
	SessionSource string `json:"session_source,omitempty"`
	Policy        string `json:"policy"`
	// Index is the residency feed the chosen replica was matched against:
	// precise, approximate or none.
	Index  string `json:"index"`
	Model  string `json:"model"`
	Path   string `json:"path"`
	Stream bool   `json:"stream"`
	// Tokens is the router's estimate of the prompt length; Blocks its
	// full prefix blocks.
	Tokens     int         `json:"tokens"`
	Blocks     int         `json:"blocks"`
	Candidates []Candidate `json:"candidates"`
	// TTFTWeight is how many times the policy counted each candidate's
	// time to first token (Wait + Import + Load + Prefill) in its Total:
	// 2 for kv-aware, 1 for the other policies that price in time, 0 when
	// the candidates carry no time terms.
	TTFTWeight float64 `json:"ttft_weight,omitempty"`
	// PrunedCandidates counts the candidates kv-aware proved could not
	// win without pricing them in full (route.Decision.Pruned), left out of
	// Candidates.
	PrunedCandidates int `json:"pruned_candidates,omitempty"`
	// Replica is the chosen replica (empty when none could take the
	// request); Reason the policy's explanation; Failed the replicas
	// tried first that failed before the first byte.
	Replica string   `json:"replica"`
	Reason  string   `json:"reason"`
	Failed  []string `json:"failed,omitempty"`
	// Served is the endpoint (host:port) the data plane reported served
	// the request (the endpoint picker's
	// x-gateway-destination-endpoint-served); empty when none reported.
	// One other than Replica's means the data plane fell back down the
	// picker's endpoint list, and Replica is then among Failed.
	Served string `json:"served,omitempty"`
	// Transfer, when the request ran a KV transfer (a prefill leg on a
	// prefill worker, or on a holder with --kv-transfer, whose
	// kv_transfer_params the forwarded body carried), says so: "from
	// <replica>", with the tokens of the blocks transferred and the
	// policy's predicted transfer time; empty otherwise.
	Transfer            string  `json:"transfer,omitempty"`
	TransferTokens      int     `json:"transfer_tokens,omitempty"`
	PredictedTransferMS float64 `json:"predicted_transfer_ms,omitempty"`
	// PrefillReplica, PrefillMS and PrefillOutcome are the request's last
	// prefill leg, when it ran one: the replica, how long the leg took
	// and how it ended (ok, error, timeout, no_params);
	// PrefillLegs counts its legs, more than one when a failed leg was
	// decided again.
	PrefillReplica string  `json:"prefill_replica,omitempty"`
	PrefillMS      float64 `json:"prefill_ms,omitempty"`
	PrefillOutcome string  `json:"prefill_outcome,omitempty"`
	PrefillLegs    int     `json:"prefill_legs,omitempty"`
	// PredictedCached is the policy's predicted cached prompt tokens (in
	// the router's tokens: an estimate in text mode); ActualCached the
	// engine's usage.prompt_tokens_details.cached_tokens and PromptTokens
	// its usage.prompt_tokens (-1: not reported, or not yet).
	PredictedCached int `json:"predicted_cached_tokens"`
	ActualCached    int `json:"actual_cached_tokens"`
	PromptTokens    int `json:"prompt_tokens"`
	// PredictedTTFTMS is the chosen candidate's predicted time to first
	// token as the policy priced it, at the replica's learned calibration
	// scale (fleet.Claim.CalibratedTTFT; 0: not predicted): the figure to
	// compare TTFTMS with.
	PredictedTTFTMS float64 `json:"predicted_ttft_ms,omitempty"`
	// SLOClass, SLOTTFTMS and SLOITLMS are the request's SLO
	// (route.SLO): its class ("default" for the fleet's own) and its
	// bounds on the time to first token and the mean inter-token latency
	// (0: none; the bounds both 0: no SLO).
	SLOClass  string  `json:"slo_class,omitempty"`
	SLOTTFTMS float64 `json:"slo_ttft_ms,omitempty"`
	SLOITLMS  float64 `json:"slo_itl_ms,omitempty"`
	// PredictedMiss is the policy's predicted probability, 0..1, that the
	// request misses its SLO on the replica it chose (route.Decision.Miss;
	// 0: no SLO or no prediction).
	PredictedMiss float64 `json:"predicted_miss,omitempty"`
	// SLOAdmission, set when a decision predicted a miss at least as
	// likely as not (no replica predicted to meet the SLO), is what the
	// router did (kvrouter serve --slo-admission): routed, queued or
	// rejected.
	SLOAdmission string `json:"slo_admission,omitempty"`
	// SLOOutcome is how a streamed response that ended ok fared against
	// its SLO: met, missed_ttft or missed_itl (empty: not judged); ITLMS
	// its measured mean inter-token latency (first byte to end over the
	// output tokens after the first; 0: fewer than 2).
	SLOOutcome string  `json:"slo_outcome,omitempty"`
	ITLMS      float64 `json:"itl_ms,omitempty"`
	// DecideMS is the time spent matching and picking (all attempts).
	DecideMS float64 `json:"decide_ms"`
	// TTFTMS is arrival to the first response byte (0: not yet); E2EMS
	// arrival to the end of the response (0 while in flight).
	TTFTMS float64 `json:"ttft_ms"`
	E2EMS  float64 `json:"e2e_ms"`
	// Status is the HTTP status sent to the client (0: not yet).
	Status int `json:"status"`
	// Outcome is one of the Outcome constants.
	Outcome string `json:"outcome"`
	// Error is what went wrong for an upstream_error or error outcome.
	Error string `json:"error,omitempty"`
}

// Candidate is one replica's cost terms in a decision, in milliseconds of
// predicted time.
type Candidate struct {
	// Replica names the replica; Matched is the prompt tokens the index
	// predicted cached there.
	Replica string `json:"replica"`
	Matched int    `json:"matched_tokens"`
	// WaitMS is the queueing delay, PrefillMS the prefill of the uncached
	// tokens, DecodeMS the request's own decode under the replica's batch,
	// OthersMS the delay it imposes on the replica's other requests,
	// MemoryMS the penalty for KV-cache pressure, FutureMS what the
	// session's later turns are expected to cost there, TotalMS the cost
	// the policy minimised.
	WaitMS    float64 `json:"wait_ms"`
	PrefillMS float64 `json:"prefill_ms"`
	DecodeMS  float64 `json:"decode_ms"`
	OthersMS  float64 `json:"others_ms"`
	MemoryMS  float64 `json:"memory_ms"`
	FutureMS  float64 `json:"future_ms"`
	// ImportMS is the KV import (or prefill leg on a prefill worker) the
	// price assumes before the prefill, LoadMS the load of blocks from the
	// replica's own CPU tier; both part of its time to first token.
	ImportMS float64 `json:"import_ms"`
	LoadMS   float64 `json:"load_ms"`
	// MissesMS is the price of the SLO misses the placement is expected
	// to cause, the request's own and its replica's others' (route.Cost's
	// Misses; 0 without an SLO), and Miss the probability that the request
	// itself misses its SLO there (route.Cost's Miss, 0..1): TotalMS =
	// TTFTWeight·(WaitMS + ImportMS + LoadMS + PrefillMS) + DecodeMS +
	// OthersMS + MemoryMS + FutureMS + MissesMS.
	MissesMS float64 `json:"misses_ms"`
	Miss     float64 `json:"miss"`
	TotalMS  float64 `json:"total_ms"`
	// Score is what a policy that ranks by a score rather than a time
	// minimised (its time terms are then zero); absent for kv-aware.
	Score float64 `json:"score,omitempty"`
}

// MS converts d to milliseconds.
func MS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

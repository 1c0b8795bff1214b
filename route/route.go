// Package route holds the routing policies: pure functions that pick a
// replica for a request from an immutable fleet snapshot.
//
// Policies read no clocks, take no locks and do no I/O, so the live router
// (package proxy) and the fleet simulator (package sim) run the same code.
// Ties are broken by a hash of the request id, never by a global random
// source, so every decision is reproducible.
package route

import "time"

// Replica is one backend as the policy sees it at decision time.
type Replica struct {
	// ID names the replica (its base URL in the live router).
	ID string
	// Healthy is false for replicas that must get no traffic, and for
	// prefill workers (RolePrefill), which take prefill legs, never a
	// request of their own.
	Healthy bool
	// Role is the replica's part in a disaggregated fleet (RoleBoth when
	// it is not one); Prefills says a RolePrefill replica can take a
	// prefill leg now (healthy and serving).
	Role     Role
	Prefills bool

	// Running, Waiting and KVUsage are the engine's own figures from its last
	// scrape; Scraped is false when no scrape has succeeded yet, and LoadAge
	// says how old they are.
	Running, Waiting int
	// KVUsage is the fraction of the engine's KV blocks in use, 0..1.
	KVUsage float64
	Scraped bool
	LoadAge time.Duration

	// InFlight is the router's own count of requests sent and not finished:
	// always fresh.
	InFlight int
	// PrefillTokens is the router's own count of prompt tokens routed here
	// whose prefill has not finished yet (first token not seen), net of the
	// tokens predicted to be cached.
	PrefillTokens int
	// Decoding is the router's own count of requests past their first token.
	Decoding int
	// Outputs is the router's requests in flight here that said their
	// output length (max_tokens), and InvOutput the sum of 1/output over
	// them: a stall of the batch matters to each sequence per token
	// (KVAware, Others).
	Outputs   int
	InvOutput float64
	// DecodeBlocks is the KV footprint, in blocks of Snapshot.BlockSize
	// tokens, of the requests this router has in flight here.
	DecodeBlocks int
	// PrefillWork is the predicted prefill time, at Scale 1, of the
	// router's requests in flight here (their uncached prompts, done or
	// not): by Little's law, the prefill compute that runs in the
	// iterations of a sequence decoding here (kv-aware's miss term).
	PrefillWork time.Duration
	// RecentPrefill is the prompt tokens (uncached part) routed here over the
	// last Needs.Window; zero when no window was asked for.
	RecentPrefill int

	// CacheBlocks is the replica's KV capacity in blocks of Snapshot.BlockSize
	// tokens (from vllm:cache_config_info, else configured).
	CacheBlocks int
	// IndexBlocks is how many blocks the residency index attributes to this
	// replica (SGLang's "smallest tree").
	IndexBlocks int
	// Share is the replica's share of the router's requests, averaged
	// over about ShareMemory of its latest decisions, as of the decision
	// numbered ShareSeq (Request.Seq): ShareAt brings it to a later one.
	Share    float64
	ShareSeq uint64

	// Rates is the replica's timing model, started from a preset and
	// corrected online from observed TTFTs.
	Rates Rates
	// LinkWait is how long the replica's interconnect is still busy with
	// the KV transfers the router ordered through it, either way; zero
	// means idle.
	LinkWait time.Duration
}

// Rates is a replica's timing model, in the units the cost model needs.
// Zero fields mean the llama3-8b-h100 preset's figure (the Default
// constants of this package).
type Rates struct {
	// PrefillPerToken is the time to prefill one prompt token at short
	// context (the weights' FLOPs).
	PrefillPerToken time.Duration
	// AttnPerMPairs is the attention time per million (token, context
	// token) pairs: prefilling n tokens after c cached ones costs
	// n×PrefillPerToken + n×(c+n/2)×AttnPerMPairs/1e6.
	AttnPerMPairs time.Duration
	// DecodeStep is the duration of one decode iteration of a batch of
	// one, step overhead included (reading the weights once).
	DecodeStep time.Duration
	// StepOverhead is the part of DecodeStep every iteration pays,
	// whatever it carries (scheduling, launches, sampling): an iteration
	// that only prefills takes it plus its compute; zero means 1.5 ms,
	// at most DecodeStep.
	StepOverhead time.Duration
	// DecodePerSeq is the extra decode iteration time per running sequence.
	DecodePerSeq time.Duration
	// DecodePerMTokens is the extra decode iteration time per million
	// tokens of context of the running sequences (reading their KV).
	DecodePerMTokens time.Duration
	// MaxSeqs is the engine's max_num_seqs; zero means 256.
	MaxSeqs int
	// MaxBatchedTokens is the engine's per-iteration token budget
	// (max_num_batched_tokens); zero means 8192.
	MaxBatchedTokens int
	// Horizon is how long an untouched cached block survives before
	// eviction on this replica (learned from its KV churn); zero means
	// unknown (no decay).
	Horizon time.Duration
	// TierHorizon is how long an untouched block survives anywhere on the
	// replica, its CPU tier too (learned from the same churn over the
	// tier's capacity); zero means no tier, or unknown. A block past
	// Horizon but within TierHorizon is loaded, not computed (at
	// LoadPerMTokens).
	TierHorizon time.Duration
	// Displaced is what a token of KV the replica newly stores costs the
	// tokens it evicts, in prefills of a token: the share of the tokens it
	// evicted that later requests asked it for again (learned online from
	// the engine's cached tokens; zero: nothing measured, or a cache that
	// has not yet had to evict). kv-aware charges it to the tokens a
	// placement copies from another replica (KVAware, Memory).
	Displaced float64
	// Scale corrects the prefill side of the model (Wait and Prefill) from
	// observed times to first token: observed / predicted, learned online;
	// zero means 1.
	Scale float64
	// DecodeScale corrects the decode side (iteration times) from observed
	// inter-token latencies: observed / predicted, learned online; zero
	// means 1.
	DecodeScale float64
	// Spread is the spread of the prefill side's prediction errors: the
	// standard deviation of log(observed / predicted) time to first token,
	// learned online beside Scale; zero means unknown, and kv-aware takes
	// PriorSpread. DecodeSpread is the same of the decode side's
	// inter-token latencies, beside DecodeScale. kv-aware's miss
	// probabilities (KVAware, Misses) read them.
	Spread, DecodeSpread float64
	// HitScale corrects the expected cached tokens (the index's match
	// times the residency model) from the engine's reported ones: actual /
	// predicted, learned online; zero means 1.
	HitScale float64
	// TransferPerMTokens is the time a million tokens of KV take over the
	// replica's interconnect, to or from a peer (KV transfer through a
	// connector such as NIXL: KV bytes per token ÷ bandwidth); zero means
	// the replica cannot transfer.
	TransferPerMTokens time.Duration
	// LoadPerMTokens is the time a million tokens of KV take to load from
	// the replica's CPU tier into GPU memory (KV bytes per token ÷ PCIe
	// bandwidth); zero means blocks on the CPU tier earn no credit.
	LoadPerMTokens time.Duration
}

// Snapshot is the fleet as the policy sees it. It is read-only; Pick must not
// retain it.
type Snapshot struct {
	Replicas []Replica
	// BlockSize is the tokens per block of Request.Match; zero means 16.
	BlockSize int
	// Summary, when not nil, is what kv-aware derives of Replicas, kept
	// up to date by whoever fills the snapshot (see Summary); nil means
	// kv-aware derives it at every Pick.
	Summary *Summary
	// Seqs is the fleet's running sequences, averaged over about
	// ShareMemory of the router's latest decisions; zero means unknown,
	// and the replicas' own counts are taken.
	Seqs float64
}

// Request is what a policy knows of one request.
type Request struct {
	// ID identifies the request; Hash is a hash of it, used for tie-breaks
	// and seeded choices.
	ID   string
	Hash uint64
	// Seq is the request's arrival number at this router (round-robin).
	Seq uint64
	// Tokens is the prompt length in tokens (an estimate in text mode).
	Tokens int
	// MaxTokens is the expected number of output tokens; zero means unknown.
	MaxTokens int
	// Blocks is the number of full prefix blocks of the prompt.
	Blocks int
	// Match holds, per replica (same index as Snapshot.Replicas), the number
	// of leading blocks believed resident there. Nil means none anywhere.
	Match []int
	// Age holds, per replica, how long ago the deepest matched block was last
	// touched there. Nil means fresh.
	Age []time.Duration
	// Fresh holds, per replica, the leading blocks of its match touched
	// there within half its eviction horizon, and FreshAge the age of the
	// deepest of them: of an old match, the part that other requests
	// sharing its prefix keep warm (a system prompt, a group's context).
	// Zero or nil means none is known apart: the whole match has Age.
	Fresh    []int
	FreshAge []time.Duration
	// Offloaded holds, per replica, the leading blocks its CPU tier holds
	// (from the engine's KV events: precise, no decay); they load over
	// PCIe (Rates.LoadPerMTokens) rather than compute. Nil means none
	// anywhere.
	Offloaded []int
	// Settled holds, per replica, how many leading blocks of its Match it
	// has computed: the rest are being computed by requests sent there
	// that have not reached their first token, so no peer can import
	// them yet (a source sends only what it holds). Nil means all of
	// Match, as when the fleet orders no transfers.
	Settled []int
	// Session is a hash of the session id, zero when the request has none.
	Session uint64
	// Pinned is the replica the session is bound to, or -1.
	Pinned int
	// FutureTurns is how many more requests of the session are expected
	// after this one: they follow it to the replica it goes to, where its
	// context is cached. Zero for a request without a session.
	FutureTurns float64
	// PrefixKey is a hash of the first 100 characters of the first user
	// message (or prompt) and the LoRA name, for consistent-hashing policies.
	PrefixKey uint64
	// SLO is the request's latency targets (per request, its key's or
	// class's, else the fleet's default); zero means none.
	SLO SLO
	// Costs, when its capacity is at least len(Snapshot.Replicas), receives
	// each candidate's cost terms (but those kv-aware proved could not
	// win without pricing them in full: Decision.Pruned), and
	// Decision.Costs aliases it. Nil means the policy records none. Callers
	// reuse it to keep Pick allocation-free.
	Costs []Cost
}

// Cost is one candidate's terms in a decision: durations for a policy
// that prices in time (kv-aware, whose Total is their sum), or a Score
// for one that ranks otherwise (the terms are then zero).
type Cost struct {
	Replica int
	// Matched is the predicted cached prompt tokens on this replica.
	Matched int
	// Wait is the time until the replica can start this prefill.
	Wait time.Duration
	// Prefill is the time to prefill the uncached part of the prompt:
	// Wait + Prefill is the predicted time to first token.
	Prefill time.Duration
	// Decode is the time to generate the output under the replica's batch.
	Decode time.Duration
	// Others is the delay the request imposes on the replica's other
	// requests (its prefill stalls their decodes; its decode slows them).
	Others time.Duration
	// Memory is the expected cost of evictions and preemption under KV
	// pressure.
	Memory time.Duration
	// Future is what the session's later turns are expected to cost on
	// this replica, under the load its bound sessions keep there.
	Future time.Duration
	// Total is what the policy minimised, for a policy that prices in time.
	Total time.Duration
	// Score is what a policy that ranks by a score rather than a time
	// minimised (an in-flight count, blocks, a negated weighted score);
	// Total and the other terms are then zero.
	Score float64
	// Import is the KV transfer the candidate's price assumes (Blocks
	// zero: none): a prefill leg on a holder of the prefix or a prefill
	// worker, whose blocks the candidate reads, was cheaper there than
	// computing the prompt itself.
	Import Transfer
	// Miss is the predicted probability, 0..1, that the request misses
	// its SLO on this candidate (Decision.Miss for the chosen one); and
	// Misses the expected SLO misses the placement causes, the request's
	// own and those it pushes over their bound of the requests on the
	// replica, priced in time (kv-aware's Total counts it). Zero for a
	// request without an SLO.
	Miss   float64
	Misses time.Duration
	// Load is the time the candidate's price spends loading the prompt's
	// blocks from its own CPU tier before the prefill (zero: none);
	// Matched counts them.
	Load time.Duration
}

// Decision is a policy's choice.
type Decision struct {
	// Replica is an index into Snapshot.Replicas, or -1 to reject.
	Replica int
	// Reason says in a word why: "prefix", "session", "least-cost",
	// "least-loaded", "round-robin", "no-healthy", ... It is a constant
	// string, so recording it allocates nothing.
	Reason string
	// Matched is the cached prompt tokens the policy predicts on Replica.
	Matched int
	// Costs aliases Request.Costs when the caller supplied it.
	Costs []Cost
	// Pruned counts the candidates kv-aware proved could not win without
	// pricing them in full (a lower bound of their Total already exceeded
	// a cheaper candidate's): they are not in Costs.
	Pruned int
	// Transfer is the KV import the decision orders before the prefill;
	// Blocks zero means none.
	Transfer Transfer
	// Miss is the predicted probability, 0..1, that the request misses
	// its SLO on Replica; zero when it has no SLO or the policy predicts
	// none. The caller's admission (route anyway, queue, reject) reads it.
	Miss float64
}

// Transfer is a KV transfer, run as two legs: replica From computes the
// prompt (a prefill leg of one output token), and the chosen replica
// reads its first Blocks blocks (of Snapshot.BlockSize tokens) from it
// instead of computing them, predicted to be there after Time (the leg
// and the link).
type Transfer struct {
	From, Blocks int
	Time         time.Duration
	// Cached is the prompt tokens replica From is predicted to cache: its
	// prefill leg computes the rest.
	Cached int
}

// TTFTWeight is how many times policy counts a candidate's time to first
// token (Wait + Import.Time + Load + Prefill) in Cost.Total: kv-aware's
// ttftWeight (kvmodel.go), 1 for the other policies (mooncake's Total is
// the plain sum; a policy that ranks by Score has no time terms).
func TTFTWeight(policy Policy) float64 {
	switch policy.(type) {
	case KVAware, *KVAware:
		return ttftWeight
	}
	return 1
}

// Policy picks a replica for a request.
type Policy interface {
	Pick(*Request, *Snapshot) Decision
}

// Func adapts a function to Policy, like http.HandlerFunc.
type Func func(*Request, *Snapshot) Decision

// Pick calls f.
func (f Func) Pick(r *Request, s *Snapshot) Decision { return f(r, s) }

// IndexKind says what residency information a policy reads.
type IndexKind uint8

const (
	// NoIndex: the policy reads no residency (Match is nil).
	NoIndex IndexKind = iota
	// Approximate: an index fed by the router's own routing decisions.
	Approximate
	// Precise: an index fed by the engines' KV events.
	Precise
)

// Needs describes the signals a policy expects, so that the simulator and
// the live router can feed each policy what it would really see. The zero
// value means: no index, metrics at the default scrape interval.
type Needs struct {
	Index IndexKind
	// IndexBlocks caps each replica's share of an approximate index, in
	// blocks; zero means the replica's CacheBlocks.
	IndexBlocks int
	// IndexTTL drops index entries untouched for longer; zero means never.
	IndexTTL time.Duration
	// BlockTokens is the index's block granularity in tokens; zero means the
	// snapshot's BlockSize.
	BlockTokens int
	// ScrapeInterval is how often the policy's source reads engine metrics;
	// zero means the router's default (100 ms).
	ScrapeInterval time.Duration
	// Window is the span of Replica.RecentPrefill; zero means not needed.
	Window time.Duration
	// Calibrate says the policy's Cost terms Wait + Prefill of the chosen
	// replica, divided by its Rates.Scale, predict its time to first token:
	// the caller may then learn Rates.Scale from the observed TTFTs.
	Calibrate bool
	// Summarize asks a caller that keeps a snapshot between decisions to
	// keep its Summary too (Snapshot.Summary), made by
	// NewSummary(StaleAfter): the policy then derives less at every Pick.
	Summarize bool
	// StaleAfter is the age beyond which the policy ignores scraped
	// metrics (Summarize's); zero means its default.
	StaleAfter time.Duration
}

// Needer is implemented by policies that need more than the defaults.
type Needer interface {
	Needs() Needs
}

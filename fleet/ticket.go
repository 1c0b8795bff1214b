package fleet

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/scrape"
)

// Claim is the load one request puts on a replica.
type Claim struct {
	// PrefillTokens is the prompt tokens the replica must compute (the
	// prompt net of the predicted cached tokens).
	PrefillTokens int
	// Tokens is the request's KV footprint in tokens (prompt plus expected
	// output).
	Tokens int
	// PredictedCached is the cached prompt tokens the policy predicted, and
	// PromptTokens the router's estimate of the prompt they are part of,
	// for the predicted-versus-actual totals.
	PredictedCached, PromptTokens int
	// PredictedTTFT is the policy's time to first token at Scale 1, which
	// the observed one calibrates the replica's rates against (FirstToken);
	// zero means it is not observed.
	PredictedTTFT time.Duration
	// PricedTTFT is the time to first token as the policy priced it: its
	// Wait + Prefill at the replica's learned Scale, plus any KV import
	// (CalibratedTTFT); zero means not predicted.
	PricedTTFT time.Duration
	// HitScale is the replica's Rates.HitScale the prediction was made
	// with (zero: 1), which the engine's cached tokens correct.
	HitScale float64
	// Stale is the most prompt tokens the index matched on a replica
	// whose match was last touched at least half that replica's eviction
	// horizon ago, or that the router sent a replica whose engine's events
	// show it holds less of them now (residency.MatchScratch.Evicted), and
	// StaleReplica that replica (Stale 0: none): what of them the engine
	// did not have cached, wherever the request went, that replica evicted
	// (Rates.Displaced).
	Stale, StaleReplica int
	// Imported is the prompt tokens the decision brings to the replica
	// from another's GPU before its prefill, beyond what the index matched
	// there (a KV import): counted in the engine's cached tokens, they
	// were not the replica's own, and it stores them.
	Imported int
	// Output is the output tokens expected (max_tokens), zero unknown:
	// its inverse counts in the replica's InvOutput.
	Output int
	// Streamed says the response streams, so that its first token and its
	// end are seen when the engine makes them: the time between, over the
	// output tokens, is its inter-token latency, which calibrates the
	// replica's DecodeScale (Done).
	Streamed bool
}

// Usage is what the engine reported of a finished request; a field is −1
// when it did not say.
type Usage struct {
	// PromptTokens is usage.prompt_tokens.
	PromptTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens.
	CachedTokens int
	// CompletionTokens is usage.completion_tokens: the output tokens.
	CompletionTokens int
}

// NoUsage is a Usage that reports nothing.
var NoUsage = Usage{PromptTokens: -1, CachedTokens: -1, CompletionTokens: -1}

// Ticket is one request's hold on a replica's accounting. Call FirstToken
// when the first output token arrives and Done exactly once on every path
// (success, error, cancel); extra calls are harmless. A nil *Ticket's
// methods do nothing.
type Ticket struct {
	f     *Fleet
	r     *replica
	claim Claim
	sent  time.Time // when the replica was chosen
	// scrapes is the replica's scrape count at Acquire (replica.gone).
	scrapes uint64
	// state is ticketPrefill, ticketDecoding or ticketDone.
	state atomic.Uint32
	// tokens counts the output tokens streamed after the first (Token).
	tokens atomic.Uint32
	// prefill is the claim's predicted prefill time at Scale 1.
	prefill time.Duration
	// For a streamed claim, FirstToken stores the replica's decode batch
	// (batch0) and prefilled total (work0) then, and the time from sent to
	// it plus 1 ns (first; zero: not yet), for the inter-token latency
	// observed at Done or as it streams (Token, which moves work0 to its
	// second token).
	batch0, work0, first atomic.Int64
	// hold is its hold on its prompt's blocks in the index (hold.go).
	hold ticketHold
	// ext is what only some tickets carry (nil: nothing): a learning
	// policy's features, a llama.cpp replica's slot. Kept behind one
	// pointer so that the ticket every decision allocates stays small.
	ext *ticketExt
}

// ticketExt is a ticket's rarer state: the features the fleet's learning
// policy kept of the decision (learned: it did; see teach) and its claim
// on a llama.cpp replica's slot (llamacpp.go; nil: none).
type ticketExt struct {
	features route.Features
	learned  bool
	slot     *slotClaim
}

// learnedTicket is a ticket committed under a learning policy, with its
// ticketExt in the same allocation.
type learnedTicket struct {
	Ticket
	ext ticketExt
}

// LegClaim is what a leg on a source replica (a prefill worker's, or a
// holder's for an import) charges it while it runs, as the live router
// and the simulator charge it: the prompt of tokens tokens, less the
// cached ones the index matched there, and one output token.
func LegClaim(tokens, cached int) Claim {
	tokens = max(tokens, 0)
	cached = min(max(cached, 0), tokens)
	return Claim{PrefillTokens: tokens - cached, Tokens: tokens + 1, PredictedCached: cached, PromptTokens: tokens}
}

// Ticket states.
const (
	ticketPrefill uint32 = iota
	ticketDecoding
	ticketDone
)

// Acquire charges a request to replica id at now and returns its ticket.
// The prefill tokens also count in the replica's RecentPrefill window.
func (f *Fleet) Acquire(id string, c Claim, now time.Time) (*Ticket, error) {
	r := f.lookup(id)
	if r == nil {
		return nil, fmt.Errorf("acquire %q: %w", id, ErrUnknownReplica)
	}
	return f.acquire(r, c, now, new(Ticket)), nil
}

// acquire charges claim c to replica r at now in t, a new zero ticket,
// and returns t.
func (f *Fleet) acquire(r *replica, c Claim, now time.Time, t *Ticket) *Ticket {
	c.PrefillTokens, c.Tokens = max(c.PrefillTokens, 0), max(c.Tokens, 0)
	r.inFlight.Add(1)
	r.prefillTokens.Add(int64(c.PrefillTokens))
	r.decodeTokens.Add(int64(c.Tokens))
	prefill := f.preset.PrefillTime(c.PrefillTokens, c.PredictedCached)
	r.work.Add(int64(prefill))
	if c.Output > 0 {
		r.outputs.Add(1)
		r.invOut.Add(1e9 / int64(c.Output))
	}
	r.changed()
	if w := f.needs.Window; w > 0 && c.PrefillTokens > 0 {
		r.mu.Lock()
		r.recent.Add(now, w, int64(c.PrefillTokens), 0)
		r.mu.Unlock()
	}
	t.f, t.r, t.claim, t.sent = f, r, c, now
	t.scrapes, t.prefill = r.scrapes.Load(), prefill
	return t
}

// Replica returns the id of the ticket's replica.
func (t *Ticket) Replica() string {
	if t == nil {
		return ""
	}
	return t.r.id
}

// Claim returns what the ticket charged.
func (t *Ticket) Claim() Claim {
	if t == nil {
		return Claim{}
	}
	return t.claim
}

// FirstToken records that prefill finished at now: the request's prefill
// tokens leave PrefillTokens, it counts as Decoding, and when the claim
// carries a predicted TTFT the time since the decision is kept for Done
// to calibrate the replica's rates with. Later calls do nothing.
func (t *Ticket) FirstToken(now time.Time) {
	if t == nil || !t.state.CompareAndSwap(ticketPrefill, ticketDecoding) {
		return
	}
	t.r.prefillTokens.Add(-int64(t.claim.PrefillTokens))
	if t.f.transfers() {
		t.r.prefills.drop(t)
	}
	t.holdBlocks(now)
	t.r.decoding.Add(1)
	t.r.changed()
	t.f.released()
	work := t.r.prefilled.Add(int64(t.prefill))
	if t.claim.Streamed || t.claim.PredictedTTFT > 0 {
		t.batch0.Store(int64(t.r.batch(now)))
		t.work0.Store(work)
		t.first.Store(int64(max(now.Sub(t.sent), 0)) + 1)
	}
}

// Done releases the request's accounting at now. u is the engine's usage
// (fields −1 when unknown); err is nil for a request that completed. A
// streamed request that completed with at least 2 output tokens
// calibrates the replica's DecodeScale with its inter-token latency (see
// observeITL). Only the first call counts.
func (t *Ticket) Done(now time.Time, u Usage, err error) {
	if t == nil {
		return
	}
	var prev uint32
	for {
		prev = t.state.Load()
		if prev == ticketDone {
			return
		}
		if t.state.CompareAndSwap(prev, ticketDone) {
			break
		}
	}
	r := t.r
	batch := 0
	if prev == ticketPrefill {
		r.prefillTokens.Add(-int64(t.claim.PrefillTokens))
		if t.f.transfers() {
			r.prefills.drop(t)
		}
	} else {
		batch = r.batch(now) // with this request
		r.decoding.Add(-1)
	}
	r.decodeTokens.Add(-int64(t.claim.Tokens))
	r.work.Add(-int64(t.prefill))
	if t.claim.Output > 0 {
		r.outputs.Add(-1)
		r.invOut.Add(-1e9 / int64(t.claim.Output))
	}
	r.inFlight.Add(-1)
	t.releaseBlocks(now)
	t.releaseSlot()
	t.leftScrape(now)
	r.changed()
	t.f.released()
	if err != nil {
		r.failed.Add(1)
		return
	}
	r.completed.Add(1)
	t.learn(now, u, batch, prev == ticketDecoding)
	t.teach(now, u)
	t.f.observeEvicted(&t.claim, u)
}

// leftScrape counts the finished request in its replica's gone when the
// last scrape, taken since its Acquire, was sent for after it (the scrape
// read the engine before now, as it was applied before), and keeps it
// among the replica's finished, for a scrape on its way now. A scrape
// that says nothing of when (a zero At) counts it.
func (t *Ticket) leftScrape(now time.Time) {
	r := t.r
	r.mu.Lock()
	r.finished.add(t.sent, now)
	if at := r.load.At; r.scrapes.Load() != t.scrapes && (at.IsZero() || !at.Before(t.sent)) {
		r.gone.Add(1)
	}
	r.mu.Unlock()
}

// finishes are a replica's last requests to finish, when each was sent
// and when it finished: a ring, under replica.mu.
type finishes struct {
	sent, done [finishesKept]time.Time
	next       int
}

// finishesKept is how many finishes a replica keeps: more than finish
// during one scrape's round trip on any engine.
const finishesKept = 32

// add keeps one more finish, dropping the oldest.
func (f *finishes) add(sent, done time.Time) {
	f.sent[f.next], f.done[f.next] = sent, done
	f.next = (f.next + 1) % finishesKept
}

// since is how many of the finishes scrape l may have counted in the
// engine's Running, applied now: it read the engine at some moment after
// it was sent (Asked; zero: At) and by At, so a request sent by At that
// finished after Asked. A zero At counts none.
func (f *finishes) since(l scrape.Load) int {
	if l.At.IsZero() {
		return 0
	}
	asked := l.Asked
	if asked.IsZero() {
		asked = l.At
	}
	n := 0
	for k := range finishesKept {
		if f.done[k].After(asked) && !f.sent[k].After(l.At) {
			n++
		}
	}
	return n
}

// learn takes what a completed request says of its replica: the view's
// totals, the corrections of Scale, DecodeScale and HitScale, and the
// tokens it stored for Displaced, learned under one lock and published
// once. (What it says of the replica that evicted its prefix, another
// one's lock, is observeEvicted's.)
func (t *Ticket) learn(now time.Time, u Usage, batch int, decoded bool) {
	r := t.r
	hits := u.CachedTokens >= 0 && u.PromptTokens > 0
	predicted := 0
	if hits {
		predicted = t.claim.PredictedOf(u.PromptTokens)
		r.promptTokens.Add(int64(u.PromptTokens))
		r.actualCached.Add(int64(u.CachedTokens))
		r.predictedCached.Add(int64(predicted))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	changed := false
	if decoded {
		// Scale first: the inter-token latency takes off the other
		// prefills at the Scale this request has just corrected.
		changed = t.observeTTFTLocked(u)
		changed = t.observeITLLocked(now, u, batch) || changed
	}
	if hits {
		t.observeHitsLocked(predicted, u.CachedTokens)
		r.displaced.observe(0, stored(u, t.claim.importedOf(u.PromptTokens)), float64(r.pub.Load().capTokens))
		changed = true
	}
	if changed {
		t.f.updateLocked(r)
	}
}

// importedOf is the claim's imported tokens counted in a prompt of
// prompt engine tokens, at most the prompt (see PredictedOf).
func (c *Claim) importedOf(prompt int) int {
	p := max(c.Imported, 0)
	if c.PromptTokens > 0 {
		p = int(int64(min(p, c.PromptTokens)) * int64(prompt) / int64(c.PromptTokens))
	}
	return min(p, prompt)
}

// PredictedOf is the claim's predicted cached tokens counted in a prompt
// of prompt engine tokens: the predicted share of the router's estimate
// of the prompt. In token mode the estimate is exact and this is
// PredictedCached; in text mode it converts the router's estimated
// tokens into the engine's, so that a predicted hit rate is never above
// 1.
func (c *Claim) PredictedOf(prompt int) int {
	p := max(c.PredictedCached, 0)
	if c.PromptTokens > 0 {
		p = int(int64(min(p, c.PromptTokens)) * int64(prompt) / int64(c.PromptTokens))
	}
	return min(p, prompt)
}

package fleet

import "time"

// The spread of a replica's inter-token latency prediction errors
// (route.Rates.DecodeSpread, kv-aware's miss probabilities) is learned
// from its requests' tokens as they stream, not only when they are done:
// on a workload of long answers (tens of seconds) a replica would
// otherwise know it only one whole answer after its first requests, and
// price them on route.PriorSpread for most of a short run. Both the live
// router (one SSE event with output is one token, as vLLM and SGLang
// stream by default) and the simulator (the engine's Token events) tell
// the ticket of each token after the first (Ticket.Token).
//
// A streaming request is observed once, after itlGaps gaps, by the
// replica's stream Calibrator (replica.scal): its DecodeSpread until the
// replica's DecodeScale Calibrator (dcal) has observed a whole answer
// (Done), whose spread it is from then on. DecodeScale itself is learned
// only from whole answers: the first gaps of a decode are not its mean
// (on multi-turn-chat at load 2 their observed / predicted is 0.88 where
// the rest of the answers' is 1.05, from sim runs logging both), and a
// scale learned from them would misprice the whole decode; a spread of
// the same ratios about their own mean carries no such bias.

// itlGaps is the inter-token gaps after which a streaming request is
// observed. The prefills whose compute is taken off the span are those
// that finished in it, counted whole: one that straddles either end of
// the window is counted whole or not at all, an error of at most one
// prefill's compute at each end, spread over the gaps: over 32 gaps a
// 16th of one prefill per gap, and 32 gaps are under a second at the
// ITLs engines serve (20–50 ms), so a replica learns its spread within a
// second of its first answers.
const itlGaps = 32

// Token records that the request's stream delivered one more output
// token, after its first (FirstToken), at now. At the first, the
// prefills finished so far are deemed to have run before its decode:
// they shared its own last prefill iterations (work0 moves to now), and
// taken off its decode they would count a prefill the decode did not
// wait for (on unique at load 2, decodes learned 0.84 of the model's
// step where the engines run at exactly the preset's). At the
// itlGaps-th, the replica's stream Calibrator observes the decode so far
// (observeDecodeLocked). Before FirstToken, after Done, or for a request
// not streamed, it does nothing.
func (t *Ticket) Token(now time.Time) {
	if t == nil || !t.claim.Streamed || t.state.Load() != ticketDecoding || t.first.Load() == 0 {
		return
	}
	n := t.tokens.Add(1)
	if n == 1 {
		t.work0.Store(t.r.prefilled.Load())
	}
	if n != itlGaps {
		return
	}
	r := t.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if t.state.Load() != ticketDecoding { // Done meanwhile
		return
	}
	if t.observeDecodeLocked(&r.scal, now, itlGaps, t.claim.PromptTokens, r.batch(now)) {
		t.f.updateLocked(r)
	}
}

package sim

import (
	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/route"
)

// A decision whose transfer comes from a prefill worker
// (route.RolePrefill) runs as the live router runs it, in two legs: the
// worker computes the prompt as a request of one output token (its own
// prefix cache counts), and when it is done, the decode replica takes
// the request with the worker's blocks arriving over both links
// (importFrom), as vLLM's decode worker reads them. The request's time
// to first token runs from its arrival, through both. A worker that is
// gone, or refuses the leg, leaves the prompt to the decode replica.

// legSuffix makes a leg's engine request id from its request's.
const legSuffix = "#prefill"

// startLeg starts job j's prefill leg when transfer t comes from a
// prefill worker, and reports whether it did.
func (r *runner) startLeg(j int, t route.Transfer) bool {
	if t.Blocks <= 0 || t.From < 0 || t.From >= len(r.reps) || r.reps[t.From].role != route.RolePrefill {
		return false
	}
	jb, f := &r.jobs[j], &r.flights[j]
	w := &r.reps[t.From]
	id := jb.id + legSuffix
	er := &r.ereq[j]
	*er = engine.Request{ID: id, Prompt: jb.prompt, Hashes: jb.hashes, MaxTokens: 1}
	if !w.alive || w.model != jb.model || w.eng.Add(r.now, er) != nil {
		f.ticket.LegDone()
		return false
	}
	f.leg, f.blocks, f.active = int32(t.From), t.Blocks, true
	f.legPredicted = max(jb.prompt-t.Cached, 0)
	r.byID[id] = int32(j)
	if w.wake < 0 || !w.eng.Busy() {
		r.step(t.From)
	}
	return true
}

// onLegDone ends job j's prefill leg, ev its worker's Done: the worker
// holds the prompt's blocks, and the decode replica takes the request,
// reading them.
func (r *runner) onLegDone(j int, ev *engine.Event) {
	f := &r.flights[j]
	f.legComputed = max(ev.PromptTokens-ev.CachedTokens, 0)
	delete(r.byID, r.jobs[j].id+legSuffix)
	f.ticket.LegDone()
	leg := route.Transfer{From: int(f.leg), Blocks: f.blocks}
	f.leg, f.active = -1, false
	r.start(j, leg)
}

// failLeg ends the prefill leg of job j, whose worker died: the decode
// replica computes the prompt itself.
func (r *runner) failLeg(j int) {
	f := &r.flights[j]
	f.legPredicted = 0
	delete(r.byID, r.jobs[j].id+legSuffix)
	f.ticket.LegDone()
	f.leg, f.active = -1, false
	r.start(j, route.Transfer{})
}

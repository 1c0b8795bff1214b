package sim

import (
	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/route"
)

// A decision that orders a transfer runs as the live router runs it, in
// two legs: the source (a prefill worker, or for an import the replica
// holding the prefix) computes the prompt as a request of one output
// token (its own prefix cache counts), charged to it in the fleet
// (fleet.LegClaim) while it runs, and when it is done, the decode
// replica takes the request with the source's blocks arriving over both
// links (importFrom), as vLLM's decode worker reads them. The request's
// time to first token runs from its arrival, through both. A source that
// is gone, or refuses the leg, leaves the prompt to the decode replica.

// pooledStore reports whether policy p emulates a system whose transfers
// read a pooled KV store, which costs no replica's compute: Mooncake's
// global scheduler (route.MooncakeGlobal), whose conductor has the
// prefill instance pull the prefix from Mooncake Store, the cluster's
// pooled DRAM, over RDMA (Qin et al., FAST 2025, §3–§4). Its transfer
// then runs as an import (importFrom) without a leg: the blocks the
// holder it names still caches (those the store was given when they
// were computed) cross the holder's and the reader's links, and no
// engine computes anything for them. Every other transfer runs as the
// live router runs it, as vLLM's two legs.
func pooledStore(p route.Policy) bool {
	switch p.(type) {
	case route.MooncakeGlobal, *route.MooncakeGlobal:
		return true
	}
	return false
}

// legSuffix makes a leg's engine request id from its request's.
const legSuffix = "#prefill"

// startLeg starts job j's prefill leg when decision's transfer t
// orders one, charged on fl, whose scratch sc decided it, and reports
// whether it did.
func (r *runner) startLeg(j int, t route.Transfer, fl *fleet.Fleet, sc *fleet.Scratch) bool {
	if t.Blocks <= 0 || t.From < 0 || t.From >= len(r.reps) || t.From == int(r.flights[j].rep) {
		return false
	}
	jb, f := &r.jobs[j], &r.flights[j]
	w := &r.reps[t.From]
	id := jb.id + legSuffix
	er := &r.ereq[j]
	*er = engine.Request{ID: id, Prompt: jb.prompt, Hashes: jb.hashes, MaxTokens: 1}
	if !w.alive || w.model != jb.model || w.eng.Add(r.now, er) != nil {
		return false
	}
	cached := 0
	if m := sc.Request.Match; t.From < len(m) {
		cached = m[t.From] * sc.Snapshot.BlockSize
	}
	f.legTicket, _ = fl.Acquire(w.id, fleet.LegClaim(jb.prompt, cached), at(r.now))
	f.leg, f.active = int32(t.From), true
	f.legPredicted = max(jb.prompt-t.Cached, 0)
	r.res.legs++
	r.byID[id] = int32(j)
	if w.wake < 0 || !w.eng.Busy() {
		r.step(t.From)
	}
	return true
}

// onLegDone ends job j's prefill leg, ev its worker's Done: the worker
// holds the prompt's blocks, and the decode replica takes the request,
// reading every full block of the prompt (whatever the decision
// ordered), as vLLM's decode worker reads the remote_block_ids the
// prefill worker returns, which name them all.
func (r *runner) onLegDone(j int, ev *engine.Event) {
	f := &r.flights[j]
	f.legComputed = max(ev.PromptTokens-ev.CachedTokens, 0)
	delete(r.byID, r.jobs[j].id+legSuffix)
	f.legTicket.Done(at(ev.At), fleet.NoUsage, nil) // as the live router, which reads no usage of a leg
	leg := route.Transfer{From: int(f.leg), Blocks: len(r.jobs[j].hashes)}
	f.leg, f.active = -1, false
	r.start(j, leg)
}

// failLeg ends the prefill leg of job j, whose worker died: the decode
// replica computes the prompt itself.
func (r *runner) failLeg(j int) {
	f := &r.flights[j]
	f.legPredicted = 0
	delete(r.byID, r.jobs[j].id+legSuffix)
	f.legTicket.Done(at(r.now), fleet.NoUsage, errKilled)
	f.leg, f.active = -1, false
	r.start(j, route.Transfer{})
}

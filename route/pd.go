package route

import (
	"slices"
	"sync"
)

// The peers' prefill/decode schedulers, for disaggregated fleets: each
// picks the decode replica with its router's own policy, decides whether
// the prompt goes to a prefill worker, and if so which. On a fleet with
// no prefill worker they are their base policy. kv-aware prices the same
// choice instead (KVAware, Leg).
//
//   - pd-round-robin: vLLM's toy P/D proxy
//     (tests/v1/kv_connector/nixl_integration/toy_proxy_server.py):
//     every request prefills remotely; prefill workers and decode
//     replicas each in round-robin order.
//   - llm-d-pd: llm-d's P/D scheduling (llm-d-inference-scheduler,
//     pkg/plugins/profile/pd_profile_handler.go with the
//     prefix-based-pd-decider): the decode profile picks the decode pod
//     with llm-d's scorers (LLMD); the prompt prefills remotely when its
//     suffix uncached there is at least nonCachedTokens (the decider's
//     default is 0: always), on the prefill pod the same scorers pick
//     among the prefill pods.
//   - dynamo-pd: Dynamo's conditional disaggregation (lib/llm/src/
//     disagg_router.rs, max_local_prefill_length 1000): the KV router
//     (DynamoKV) picks the decode worker; the prompt prefills remotely
//     when prompt − prefix hit > 1000 tokens, on the prefill worker with
//     the least queued prefill (Dynamo's prefill workers pull from one
//     queue, so the first free takes it). The vLLM example worker's cap
//     on the prefill queue's length (max_prefill_queue_size) is not
//     modelled: the snapshot counts queued tokens, not queued legs.
//
// The leg sends all the prompt's blocks but the last token's, as vLLM's
// prefill worker returns them, and the decision predicts them cached on
// the decode replica (Matched); its transfer time is not predicted.
type PD struct {
	// Decode and Prefill pick the decode replica among the candidates,
	// and the prefill worker among the prefill workers (on a view of the
	// snapshot where they are the candidates).
	Decode, Prefill Policy
	// MinUncached is the fewest prompt tokens uncached on the decode
	// replica for which the prompt prefills remotely; zero: always.
	MinUncached int
	// needs is what Decode and Prefill read together.
	needs Needs
}

// pdRoundRobin, llmdPD and dynamoPD are the peers' P/D schedulers.
func pdRoundRobin() PD { return PD{Decode: RoundRobin{}, Prefill: RoundRobin{}} }
func llmdPD() PD       { return PD{Decode: LLMD{}, Prefill: LLMD{}, needs: LLMD{}.Needs()} }
func dynamoPD() PD {
	return PD{Decode: DynamoKV{}, Prefill: Func(leastQueued), MinUncached: 1001, needs: DynamoKV{}.Needs()}
}

// Needs is what the decode and prefill policies read.
func (p PD) Needs() Needs { return p.needs }

// Pick picks the decode replica, then the prefill worker if the prompt
// goes to one.
func (p PD) Pick(r *Request, s *Snapshot) Decision {
	d := p.Decode.Pick(r, s)
	if d.Replica < 0 {
		return d
	}
	bs := blockSize(s)
	uncached := r.Tokens - min(matchOf(r, d.Replica)*bs, r.Tokens)
	blocks := max(r.Tokens-1, 0) / bs
	if uncached < max(p.MinUncached, 1) || blocks*bs <= r.Tokens-uncached {
		return d
	}
	view := prefillView(s)
	if view == nil {
		return d
	}
	costs := r.Costs
	r.Costs = nil // the decode pick's are the decision's
	w := p.Prefill.Pick(r, view)
	r.Costs = costs
	views.Put(view)
	if w.Replica < 0 {
		return d
	}
	d.Transfer = Transfer{From: w.Replica, Blocks: blocks, Cached: min(matchOf(r, w.Replica)*bs, r.Tokens)}
	d.Matched, d.Reason = blocks*bs, ReasonDisagg
	return d
}

// prefillView is a copy of s with the prefill workers as its candidates
// and no other, from views (Put it back); nil when there is none.
func prefillView(s *Snapshot) *Snapshot {
	if !slices.ContainsFunc(s.Replicas, func(rp Replica) bool { return rp.Prefills }) {
		return nil
	}
	v := views.Get().(*Snapshot)
	v.BlockSize, v.Seqs = s.BlockSize, s.Seqs
	v.Replicas = append(v.Replicas[:0], s.Replicas...)
	for i := range v.Replicas {
		v.Replicas[i].Healthy = v.Replicas[i].Prefills
	}
	return v
}

// views are prefillView's snapshots, kept with their replicas' room.
var views = sync.Pool{New: func() any { return new(Snapshot) }}

// leastQueued picks the candidate with the least prefill queued, ties to
// the lowest tieKey.
func leastQueued(r *Request, s *Snapshot) Decision {
	best := -1
	for i := range s.Replicas {
		rp := &s.Replicas[i]
		if !rp.Healthy {
			continue
		}
		if b := &s.Replicas[max(best, 0)]; best < 0 || rp.PrefillTokens < b.PrefillTokens ||
			rp.PrefillTokens == b.PrefillTokens && tieKey(r.Hash, i) < tieKey(r.Hash, best) {
			best = i
		}
	}
	if best < 0 {
		return rejected(r)
	}
	return Decision{Replica: best, Reason: ReasonLeastLoaded}
}

var (
	_ Policy = PD{}
	_ Needer = PD{}
)

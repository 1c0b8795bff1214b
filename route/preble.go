package route

import "time"

// PrebleE2 emulates Preble's E2 (exploitation vs exploration) scheduler.
//
// Source: Srivatsa et al., "Preble: Efficient Distributed Prompt Scheduling
// for LLM Serving", ICLR 2025 (github.com/WukLab/preble, global scheduler):
// a global radix tree of prompts records which GPUs hold each node. If the
// request's missed tokens < its matched tokens → exploit: among the GPUs
// holding the matched prefix, the one with the lowest load cost. Else
// explore: the GPU with the lowest load cost plus the prefill cost of the
// request there. Load cost over a 3-minute window: the prefill time of the
// (miss-rate weighted) work assigned to the GPU plus running requests ×
// median output length × decode time per token. Rebalancing: when the
// heaviest GPU carries ≥ 1.5× the lightest, load moves to the lightest; a
// hot prefix that overloads its GPU is replicated to the lightest.
//
// Emulation from the snapshot:
//   - the radix tree is the shared approximate index; the matched prefix is
//     the deepest Match, its holders the replicas with that Match;
//   - windowed prefill work is Replica.RecentPrefill (uncached tokens routed
//     over Needs.Window = 3 min) × Rates.PrefillPerToken;
//   - decode load: running (the router's own InFlight, as Preble counts its
//     own requests) × MedianOutput × the per-sequence share of a decode step,
//     step(B)/B, i.e. MedianOutput × step(B) for B > 0;
//   - rebalance and hot-prefix replication happen per request, not in a
//     background pass: in the exploit branch, when the chosen holder is the
//     heaviest healthy replica and its load cost is ≥ RebalanceRatio × the
//     lightest replica's (floored at this request's own full prefill time, so
//     an idle fleet does not bounce every prefix), the request goes to the
//     lightest replica instead, which then holds the prefix too (the index
//     records the choice): the hot prefix is replicated.
//
// Ties go to the lowest tieKey of Request.Hash.
type PrebleE2 struct {
	// MedianOutput is the median output length in tokens; zero means 256
	// (Preble learns it online; 256 is a typical chat median).
	MedianOutput int
	// RebalanceRatio triggers rebalancing; zero means Preble's 1.5.
	RebalanceRatio float64
}

// Needs asks for an approximate index and a 3-minute prefill window.
func (PrebleE2) Needs() Needs { return Needs{Index: Approximate, Window: 3 * time.Minute} }

// load is replica rp's Preble load cost.
func (p PrebleE2) load(rp *Replica) time.Duration {
	rt := rp.Rates.WithDefaults()
	out := p.MedianOutput
	if out <= 0 {
		out = 256
	}
	l := time.Duration(rp.RecentPrefill) * rt.PrefillPerToken
	if rp.InFlight > 0 {
		l += time.Duration(out) * rt.nominalStep(rp.InFlight)
	}
	return l
}

// Pick exploits the matched prefix's holders or explores all replicas.
func (p PrebleE2) Pick(r *Request, s *Snapshot) Decision {
	bs := blockSize(s)
	deepest, n := 0, 0
	light, heavy := newChooser(r, 0), newChooser(r, 0)
	for i := range s.Replicas {
		if rp := &s.Replicas[i]; rp.Healthy {
			n++
			deepest = max(deepest, matchOf(r, i))
			l := float64(p.load(rp))
			light.consider(i, l)
			heavy.consider(i, -l)
		}
	}
	if n == 0 {
		return rejected(r)
	}
	matched := min(deepest*bs, r.Tokens)
	c := newChooser(r, len(s.Replicas))
	c.timed = true // loads and prefills in ns
	if r.Tokens-matched < matched {
		for i := range s.Replicas {
			if rp := &s.Replicas[i]; rp.Healthy && matchOf(r, i) == deepest {
				c.offer(i, float64(p.load(rp)), matched)
			}
		}
		ratio := p.RebalanceRatio
		if ratio <= 0 {
			ratio = 1.5
		}
		floor := 0.0
		if c.best >= 0 {
			rt := s.Replicas[c.best].Rates.WithDefaults()
			floor = float64(rt.PrefillTime(r.Tokens, 0))
		}
		if c.best == heavy.best && c.best != light.best && c.key >= ratio*max(light.key, floor) {
			return Decision{Replica: light.best, Reason: ReasonRebalance, Matched: min(matchOf(r, light.best)*bs, r.Tokens), Costs: c.costs}
		}
		return c.decision(ReasonExploit, matched)
	}
	for i := range s.Replicas {
		if rp := &s.Replicas[i]; rp.Healthy {
			rt := rp.Rates.WithDefaults()
			m := min(matchOf(r, i)*bs, r.Tokens)
			c.offer(i, float64(p.load(rp)+rt.PrefillTime(r.Tokens-m, m)), m)
		}
	}
	return c.decision(ReasonExplore, min(matchOf(r, c.best)*bs, r.Tokens))
}

var (
	_ Policy = PrebleE2{}
	_ Needer = PrebleE2{}
)

package route

import "time"

// Mooncake emulates the Mooncake Conductor's cache-aware prefill scheduling,
// without a shared KV store.
//
// Source: Qin et al., "Mooncake: Trading More Storage for Less Computation",
// FAST 2025, §5 (Algorithm 1, KVCache-centric scheduling): for each prefill
// instance, TTFT = T_queue + T_prefill(prompt, prefix_len), T_queue the sum
// of its queued prefill work; the instance with the least estimated TTFT
// wins. Mooncake adds a transfer term for fetching the prefix from its
// distributed KV pool; this fleet has no transfer path, so it is left out
// (for kvrouter too).
//
// Emulation: T_queue = Replica.PrefillTokens (the router's own queued,
// uncached prefill tokens) × Rates.PrefillPerToken; T_prefill is the prefill
// time of the unmatched tokens after the matched ones, with the attention
// term (Rates); prefix_len is Request.Match from a precise index (Mooncake's
// conductor sees the true cache); both times × Rates.Scale. Ties go to the
// lowest tieKey of Request.Hash.
type Mooncake struct{}

// Needs asks for a precise index, and for its TTFT estimate to be
// calibrated against observed TTFTs (Rates.Scale), as kv-aware's is.
func (Mooncake) Needs() Needs { return Needs{Index: Precise, Calibrate: true} }

// Pick chooses the least estimated TTFT.
func (Mooncake) Pick(r *Request, s *Snapshot) Decision {
	bs := blockSize(s)
	c := newChooser(r, len(s.Replicas))
	for i := range s.Replicas {
		rp := &s.Replicas[i]
		if !rp.Healthy {
			continue
		}
		rt := rp.Rates.WithDefaults()
		m := min(matchOf(r, i)*bs, r.Tokens)
		wait := scaled(time.Duration(rp.PrefillTokens)*rt.PrefillPerToken, rt.Scale)
		pre := scaled(rt.PrefillTime(r.Tokens-m, m), rt.Scale)
		c.consider(i, float64(wait+pre))
		if c.costs != nil {
			c.costs = append(c.costs, Cost{Replica: i, Matched: m, Wait: wait, Prefill: pre, Total: wait + pre})
		}
	}
	return c.decision(ReasonLeastTTFT, min(matchOf(r, c.best)*bs, r.Tokens))
}

var (
	_ Policy = Mooncake{}
	_ Needer = Mooncake{}
)

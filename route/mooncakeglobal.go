package route

import "time"

// MooncakeGlobal emulates the Mooncake Conductor's global, transfer-aware
// scheduling (Qin et al., FAST 2025, §5, Algorithm 1), where Mooncake
// (the local variant) leaves the transfer out.
//
// For each prefill instance the conductor knows its own cached prefix and
// the longest one on any instance. When the longest is more than
// Threshold times the instance's own, the instance is priced as pulling
// the difference from the holder first: TTFT = T_transfer + T_queue +
// T_prefill(prompt, longest prefix); otherwise TTFT = T_queue +
// T_prefill(prompt, own prefix). The least TTFT wins, and a chosen
// instance that pulls gets Decision.Transfer. Because pulled blocks stay,
// hot blocks end up on most instances.
//
// Emulation: as Mooncake for T_queue and T_prefill (precise index, times
// × Rates.Scale); T_transfer is the missing tokens over the slower of the
// two replicas' links (Rates.TransferPerMTokens) after what either still
// carries (Replica.LinkWait). Without a transfer path (no
// TransferPerMTokens) it is Mooncake. The pull reads Mooncake Store,
// the cluster's pooled DRAM (the paper's §3–§4), which costs no
// replica's compute: the simulator runs it as an import with no prefill
// leg on the holder (sim/legs.go, pooledStore).
type MooncakeGlobal struct {
	// Threshold is kvcache_balancing_threshold: the longest prefix
	// elsewhere must exceed the instance's own this many times for it to
	// pull; zero means 1 (any longer prefix; the paper gives no value).
	Threshold float64
}

// Needs asks for what Mooncake asks.
func (MooncakeGlobal) Needs() Needs { return Mooncake{}.Needs() }

// Pick chooses the least estimated TTFT, transfers included.
func (p MooncakeGlobal) Pick(r *Request, s *Snapshot) Decision {
	bs := blockSize(s)
	threshold := p.Threshold
	if threshold <= 0 {
		threshold = 1
	}
	// The holder of the longest prefix; of several, the least busy link.
	src, best := -1, 0
	for i := range s.Replicas {
		rp := &s.Replicas[i]
		m := min(matchOf(r, i)*bs, r.Tokens)
		if i < len(r.Settled) {
			m = min(m, r.Settled[i]*bs) // a pull takes only computed blocks
		}
		if rp.Healthy && rp.Rates.TransferPerMTokens > 0 && m > 0 &&
			(m > best || m == best && rp.LinkWait < s.Replicas[src].LinkWait) {
			src, best = i, m
		}
	}
	c := newChooser(r, len(s.Replicas))
	var chosen Transfer // the best's pull so far
	for i := range s.Replicas {
		rp := &s.Replicas[i]
		if !rp.Healthy {
			continue
		}
		rt := rp.Rates.WithDefaults()
		m := min(matchOf(r, i)*bs, r.Tokens)
		var pull Transfer
		if src >= 0 && i != src && rp.Rates.TransferPerMTokens > 0 && float64(best) > threshold*float64(m) {
			per := max(rp.Rates.TransferPerMTokens, s.Replicas[src].Rates.TransferPerMTokens)
			t := time.Duration(float64(best-m)*float64(per)*1e-6) + max(rp.LinkWait, s.Replicas[src].LinkWait)
			pull, m = Transfer{From: src, Blocks: best / bs, Time: t}, best
		}
		wait := scaled(time.Duration(rp.PrefillTokens)*rt.PrefillPerToken, rt.Scale)
		pre := scaled(rt.PrefillTime(r.Tokens-m, m), rt.Scale)
		c.consider(i, float64(pull.Time+wait+pre))
		if c.best == i {
			chosen = pull
		}
		if c.costs != nil {
			c.costs = append(c.costs, Cost{Replica: i, Matched: m, Wait: wait, Prefill: pre, Total: pull.Time + wait + pre, Import: pull})
		}
	}
	if chosen.Blocks > 0 {
		d := c.decision(ReasonTransfer, best)
		d.Transfer = chosen
		return d
	}
	return c.decision(ReasonLeastTTFT, min(matchOf(r, c.best)*bs, r.Tokens))
}

var (
	_ Policy = MooncakeGlobal{}
	_ Needer = MooncakeGlobal{}
)

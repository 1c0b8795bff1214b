package route

import "time"

// kvAwareRef is KVAware.Pick written plainly: every healthy replica priced
// in full, one after the other, with nothing hoisted, cached or pruned. It
// is the cost model of KVAware's doc, operation for operation in float64
// nanoseconds, and the yardstick of the fast Pick
// (TestKVAwareMatchesReference); TestKVAwareGoldenDigest pins it in turn.
func kvAwareRef(p KVAware, r *Request, s *Snapshot) Decision {
	p = p.withDefaults()
	bs := blockSize(s)
	out := r.MaxTokens
	if out <= 0 {
		out = p.MeanOutput
	}
	costs := costsFor(r, len(s.Replicas))
	best, bestCached, maxCached, bestTotal := -1, 0, 0, 0.0
	for i := range s.Replicas {
		rp := &s.Replicas[i]
		if !rp.Healthy {
			continue
		}
		k, total := refTerms(p, r, rp, i, bs, out)
		if costs != nil {
			costs = append(costs, k)
		}
		maxCached = max(maxCached, k.Matched)
		if best < 0 || total < bestTotal || total == bestTotal && p.tieBefore(r, i, best) {
			best, bestTotal, bestCached = i, total, k.Matched
		}
	}
	if best < 0 {
		return Decision{Replica: -1, Reason: ReasonNoHealthy, Costs: costs}
	}
	return Decision{Replica: best, Reason: kvReason(r, best, bestCached, maxCached, bs), Matched: bestCached, Costs: costs}
}

// refTerms prices replica rp (index i) for r: the Cost the fast Pick
// records for a candidate it prices in full, and its total in ns.
func refTerms(p KVAware, r *Request, rp *Replica, i, bs, out int) (Cost, float64) {
	var tm timing
	tm.set(&rp.Rates)
	cached := 0
	if m := min(matchOf(r, i)*bs, r.Tokens); matchOf(r, i) > 0 && m > 0 {
		cached = int(residency(ageOf(r, i), rp.Rates.Horizon) * float64(m))
	}
	uncached := float64(r.Tokens - cached)
	prefill := tm.prefill(uncached, float64(cached))
	need := (uncached + float64(out)) * (1 / float64(bs))
	fresh := rp.Scraped && rp.LoadAge <= p.StaleAfter

	queued := rp.PrefillTokens
	own := max(rp.InFlight-rp.Decoding, 0)
	occupancy, batch := rp.InFlight, float64(rp.Decoding)
	if fresh {
		if extra := rp.Waiting - own; extra > 0 {
			per := r.Tokens
			if own > 0 {
				per = rp.PrefillTokens / own
			}
			queued += extra * per
		}
		occupancy = max(occupancy, rp.Running+rp.Waiting)
		batch = float64(rp.Running)
	}
	wait := float64(queued) * tm.perTok
	if over := float64(occupancy) - tm.maxSeqs + 1; over > 0 {
		wait += over * float64(out) * (tm.step + tm.maxSeqs*tm.perSeq) * tm.invSeqs
	}

	decode := tm.step + batch*tm.perSeq + prefill*batch*tm.invSeqs

	memory := 0.0
	capacity, after, full := float64(rp.CacheBlocks), 0.0, false
	if capacity <= 0 {
		capacity, after, full = 1, rp.KVUsage, fresh && rp.KVUsage > p.HighWater
	} else {
		used := float64(rp.DecodeBlocks)
		if x := rp.KVUsage * capacity; fresh && (x > used || x != x) {
			used = x
		}
		after = used + need
		full = after > p.HighWater*capacity
	}
	if full {
		frac := max((after/capacity-p.HighWater)/(1-p.HighWater), 0)
		memory = frac * tm.prefill(need*float64(bs), 0)
		if after > capacity {
			ctx := need * float64(bs)
			if rp.InFlight > 0 && rp.DecodeBlocks > 0 {
				ctx = float64(rp.DecodeBlocks*bs) / float64(rp.InFlight)
			}
			memory += tm.prefill(ctx, 0)
		}
	}

	scale := 1.0
	if rp.Rates.Scale > 0 {
		scale = rp.Rates.Scale
	}
	wait, prefill, decode, memory = wait*scale, prefill*scale, decode*scale, memory*scale
	total := wait + prefill + decode + memory
	if i == r.Pinned && p.PinBonus > 0 {
		total = max(total-float64(p.PinBonus), 0)
	}
	return Cost{Replica: i, Matched: cached, Wait: time.Duration(wait), Prefill: time.Duration(prefill),
		Decode: time.Duration(decode), Memory: time.Duration(memory), Total: time.Duration(total)}, total
}

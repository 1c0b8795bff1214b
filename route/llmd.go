package route

import "time"

// LLMD emulates the llm-d inference scheduler's default profile.
//
// Source: llm-d inference-scheduler (gateway-api-inference-extension
// plugins, v0.2–0.3 default config): a weighted sum of scorers in [0,1],
// highest total wins, random tie-break: queue-scorer ×2 =
// (maxQ − q)/(maxQ − minQ) over the candidates, q the engine's waiting queue
// (all equal → 1); kv-cache-utilization-scorer ×2 = 1 − kv_usage;
// prefix-cache-scorer ×3 = matched blocks / prompt blocks from an
// approximate index (blocks of 64 tokens, updated with the chosen pod at
// routing time, per-pod LRU of 31,250 blocks). Engine metrics are scraped
// every 50 ms.
//
// Emulation: q and kv_usage are Replica.Waiting and Replica.KVUsage as last
// scraped, used however stale (llm-d does not discount them); the prefix
// score is Match/Blocks, Match and Blocks both counted in the index's
// 64-token blocks (Needs.BlockTokens); the random tie-break is the lowest
// tieKey of Request.Hash. Cost.Score is −score.
type LLMD struct {
	// QueueWeight, KVWeight and PrefixWeight weigh the three scorers; zero
	// means llm-d's defaults 2, 2 and 3.
	QueueWeight, KVWeight, PrefixWeight float64
}

// Needs asks for llm-d's approximate prefix index and 50 ms scrapes.
func (LLMD) Needs() Needs {
	return Needs{Index: Approximate, IndexBlocks: 31250, BlockTokens: 64, ScrapeInterval: 50 * time.Millisecond}
}

// Pick chooses the highest weighted score.
func (p LLMD) Pick(r *Request, s *Snapshot) Decision {
	wq, wk, wp := p.QueueWeight, p.KVWeight, p.PrefixWeight
	if wq <= 0 {
		wq = 2
	}
	if wk <= 0 {
		wk = 2
	}
	if wp <= 0 {
		wp = 3
	}
	minQ, maxQ, n := 0, 0, 0
	for i := range s.Replicas {
		if rp := &s.Replicas[i]; rp.Healthy {
			if n == 0 || rp.Waiting < minQ {
				minQ = rp.Waiting
			}
			maxQ = max(maxQ, rp.Waiting)
			n++
		}
	}
	c := newChooser(r, len(s.Replicas))
	bs := blockSize(s)
	for i := range s.Replicas {
		rp := &s.Replicas[i]
		if !rp.Healthy {
			continue
		}
		q := 1.0
		if maxQ > minQ {
			q = float64(maxQ-rp.Waiting) / float64(maxQ-minQ)
		}
		score := wq*q + wk*(1-min(max(rp.KVUsage, 0), 1)) + wp*ratioOf(r, i)
		c.offer(i, -score, matchOf(r, i)*bs)
	}
	return c.decision(ReasonScore, matchOf(r, c.best)*bs)
}

var (
	_ Policy = LLMD{}
	_ Needer = LLMD{}
)

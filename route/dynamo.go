package route

// DynamoKV emulates NVIDIA Dynamo's KV router.
//
// Source: Dynamo (lib/llm/src/kv_router/scheduler.rs, v0.4–0.5,
// KvRouterConfig defaults overlap_score_weight 1.0, router_temperature 0):
// an index of engine KV blocks from KV events; for each worker
// prefill_blocks = (active prefill tokens + prompt tokens) / block_size,
// cost = weight × max(prefill_blocks − overlap_blocks, 0) + decode_blocks,
// where decode_blocks are the KV blocks of the sequences it is serving plus
// this request's blocks; argmin; with temperature 0, ties go to the worker
// with the fewest cached blocks, then at random.
//
// Emulation: active prefill tokens are Replica.PrefillTokens and the active
// sequences' blocks Replica.DecodeBlocks (the router's own tracker, no scrape
// delay, as Dynamo's); overlap is Request.Match from a precise index; cached
// blocks are Replica.IndexBlocks; the final random tie-break is the lowest
// tieKey of Request.Hash. Cost.Score is the cost in blocks.
type DynamoKV struct {
	// OverlapWeight is overlap_score_weight; zero means 1.0.
	OverlapWeight float64
}

// Needs asks for a precise (KV-event) index.
func (DynamoKV) Needs() Needs { return Needs{Index: Precise} }

// Pick chooses the least block cost.
func (p DynamoKV) Pick(r *Request, s *Snapshot) Decision {
	w := p.OverlapWeight
	if w <= 0 {
		w = 1
	}
	bs := blockSize(s)
	reqBlocks := (r.Tokens + bs - 1) / bs
	costs := costsFor(r, len(s.Replicas))
	best, bestCost := -1, 0.0
	for i := range s.Replicas {
		rp := &s.Replicas[i]
		if !rp.Healthy {
			continue
		}
		pre := float64(rp.PrefillTokens+r.Tokens)/float64(bs) - float64(matchOf(r, i))
		cost := w*max(pre, 0) + float64(rp.DecodeBlocks+reqBlocks)
		if costs != nil {
			costs = append(costs, Cost{Replica: i, Matched: min(matchOf(r, i)*bs, r.Tokens), Score: cost})
		}
		if best < 0 || cost < bestCost || cost == bestCost && dynamoTie(r, s, i, best) {
			best, bestCost = i, cost
		}
	}
	if best < 0 {
		return Decision{Replica: -1, Reason: ReasonNoHealthy, Costs: costs}
	}
	reason := ReasonLeastCost
	if matchOf(r, best) > 0 {
		reason = ReasonPrefix
	}
	return Decision{Replica: best, Reason: reason, Matched: min(matchOf(r, best)*bs, r.Tokens), Costs: costs}
}

// dynamoTie reports whether i beats best on a cost tie: fewer cached blocks,
// then the lower tieKey.
func dynamoTie(r *Request, s *Snapshot, i, best int) bool {
	a, b := s.Replicas[i].IndexBlocks, s.Replicas[best].IndexBlocks
	if a != b {
		return a < b
	}
	return tieKey(r.Hash, i) < tieKey(r.Hash, best)
}

var (
	_ Policy = DynamoKV{}
	_ Needer = DynamoKV{}
)

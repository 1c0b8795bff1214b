package route

// SGLangCacheAware emulates the SGLang router's default policy, cache_aware.
//
// Source: SGLang router / SMG (sgl-router, src/policies/cache_aware.rs,
// v0.1.x–0.2): per model, an approximate radix tree over the characters of
// the routed request text with one tenant per worker, fed by its own routing
// decisions. The fleet is imbalanced when max_load − min_load >
// balance_abs_threshold (64) and max_load > balance_rel_threshold (1.5) ×
// min_load, load being the router's own in-flight count. Imbalanced → the
// least loaded worker. Balanced → the worker with the longest prefix match
// if matched/text > cache_threshold (0.3), else the worker with the
// smallest tree. Defaults: 64, 1.5, 0.3, LRU leaves evicted every 120 s
// down to max_tree_size = 2^26 characters.
//
// Emulation: the tree over characters becomes the shared approximate index
// over prompt blocks: match ratio = Match/Blocks (a prompt shorter than one
// block has ratio 0), the tree's size is Replica.IndexBlocks. SGLang's
// eviction is size-triggered, not age-triggered; 2^26 characters is about
// 2^20 blocks of 16 tokens at 4 characters per token, far above any engine's
// cache, so Needs asks for that cap and no TTL (the tree, like SGLang's,
// believes in blocks the engine has long evicted). Ties (equal loads,
// equal matches, equal trees) go to the lowest tieKey of Request.Hash.
type SGLangCacheAware struct {
	// BalanceAbs is balance_abs_threshold in requests; zero means 64.
	BalanceAbs int
	// BalanceRel is balance_rel_threshold; zero means 1.5.
	BalanceRel float64
	// CacheThreshold is cache_threshold, a match ratio 0..1; zero means 0.3.
	CacheThreshold float64
}

// Needs asks for an approximate index capped at SGLang's max_tree_size.
func (SGLangCacheAware) Needs() Needs {
	return Needs{Index: Approximate, IndexBlocks: 1 << 20}
}

// Pick applies the imbalance gate, then the match threshold.
func (p SGLangCacheAware) Pick(r *Request, s *Snapshot) Decision {
	abs, rel, th := p.BalanceAbs, p.BalanceRel, p.CacheThreshold
	if abs <= 0 {
		abs = 64
	}
	if rel <= 0 {
		rel = 1.5
	}
	if th <= 0 {
		th = 0.3
	}
	minL, maxL, n := 0, 0, 0
	for i := range s.Replicas {
		if rp := &s.Replicas[i]; rp.Healthy {
			if n == 0 || rp.InFlight < minL {
				minL = rp.InFlight
			}
			maxL = max(maxL, rp.InFlight)
			n++
		}
	}
	if n == 0 {
		return rejected(r)
	}
	bs := blockSize(s)
	if maxL-minL > abs && float64(maxL) > rel*float64(minL) {
		d := LeastLoaded{}.Pick(r, s)
		d.Reason = ReasonImbalanced
		return d
	}
	longest, tree := newChooser(r, len(s.Replicas)), newChooser(r, 0)
	tree.costs = nil
	for i := range s.Replicas {
		if s.Replicas[i].Healthy {
			longest.offer(i, -ratioOf(r, i), matchOf(r, i)*bs)
			tree.consider(i, float64(s.Replicas[i].IndexBlocks))
		}
	}
	if -longest.key > th {
		return longest.decision(ReasonPrefix, matchOf(r, longest.best)*bs)
	}
	d := tree.decision(ReasonSmallestTree, matchOf(r, tree.best)*bs)
	d.Costs = longest.costs
	return d
}

var (
	_ Policy = SGLangCacheAware{}
	_ Needer = SGLangCacheAware{}
)

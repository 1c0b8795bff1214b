package route

import (
	"math"
	"time"
)

// AIBrixPrefix emulates AIBrix's prefix-cache routing strategy.
//
// Source: AIBrix gateway plugin (pkg/plugins/gateway/algorithms/
// prefix_cache.go, v0.3): if max − min of the pods' running requests
// exceeds 8, the pod with the fewest running; else the prompt's blocks are
// matched in a per-pod prefix hash table (LRU of 200,000 blocks, entries
// idle for 20 minutes dropped), the pods sorted by match ratio descending
// then running ascending, and the first whose running count is at most
// mean + 1σ (over the pods) wins; none → the fewest running.
//
// Emulation: running is the engine's Replica.Running as last scraped; the
// table is the shared approximate index with AIBrix's size and TTL (Needs);
// "first in the sorted order" is computed in one pass without sorting; ties
// left by the sort go to the lowest tieKey of Request.Hash.
type AIBrixPrefix struct {
	// RunningGap is the imbalance threshold in running requests; zero means 8.
	RunningGap int
	// StdDevs is how many standard deviations above the mean a pod may run;
	// zero means 1.
	StdDevs float64
}

// Needs asks for AIBrix's approximate index size and TTL.
func (AIBrixPrefix) Needs() Needs {
	return Needs{Index: Approximate, IndexBlocks: 200000, IndexTTL: 20 * time.Minute}
}

// Pick applies the running-gap gate, then ratio, running and the σ bound.
func (p AIBrixPrefix) Pick(r *Request, s *Snapshot) Decision {
	gap, k := p.RunningGap, p.StdDevs
	if gap <= 0 {
		gap = 8
	}
	if k <= 0 {
		k = 1
	}
	minR, maxR, n := 0, 0, 0
	sum, sum2 := 0.0, 0.0
	least := newChooser(r, len(s.Replicas))
	for i := range s.Replicas {
		rp := &s.Replicas[i]
		if !rp.Healthy {
			continue
		}
		if n == 0 || rp.Running < minR {
			minR = rp.Running
		}
		maxR = max(maxR, rp.Running)
		n++
		sum += float64(rp.Running)
		sum2 += float64(rp.Running) * float64(rp.Running)
		least.offer(i, float64(rp.Running), 0)
	}
	if n == 0 {
		return rejected(r)
	}
	bs := blockSize(s)
	if maxR-minR > gap {
		return least.decision(ReasonLeastRunning, matchOf(r, least.best)*bs)
	}
	mean := sum / float64(n)
	bound := mean + k*math.Sqrt(max(sum2/float64(n)-mean*mean, 0))
	best := -1
	for i := range s.Replicas {
		rp := &s.Replicas[i]
		if rp.Healthy && float64(rp.Running) <= bound && (best < 0 || aibrixBefore(r, s, i, best)) {
			best = i
		}
	}
	if best < 0 || matchOf(r, best) == 0 {
		return least.decision(ReasonLeastRunning, matchOf(r, least.best)*bs)
	}
	return Decision{Replica: best, Reason: ReasonPrefix, Matched: matchOf(r, best) * bs, Costs: least.costs}
}

// aibrixBefore reports whether replica i sorts before j: higher match ratio,
// then fewer running, then the lower tieKey.
func aibrixBefore(r *Request, s *Snapshot, i, j int) bool {
	if a, b := ratioOf(r, i), ratioOf(r, j); a != b {
		return a > b
	}
	if a, b := s.Replicas[i].Running, s.Replicas[j].Running; a != b {
		return a < b
	}
	return tieKey(r.Hash, i) < tieKey(r.Hash, j)
}

var (
	_ Policy = AIBrixPrefix{}
	_ Needer = AIBrixPrefix{}
)

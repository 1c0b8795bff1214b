package route

import "time"

// Reasons a Decision may carry. They are constants, so recording one
// allocates nothing; the dashboard and the metrics group decisions by them.
const (
	// ReasonNoHealthy: no healthy replica; Decision.Replica is -1.
	ReasonNoHealthy = "no-healthy"
	// ReasonRoundRobin: the next replica in turn.
	ReasonRoundRobin = "round-robin"
	// ReasonRandom: a replica drawn from the request's hash.
	ReasonRandom = "random"
	// ReasonLeastLoaded: the fewest in-flight requests.
	ReasonLeastLoaded = "least-loaded"
	// ReasonPowerOfTwo: the less loaded of two drawn replicas.
	ReasonPowerOfTwo = "power-of-two"
	// ReasonSession: the session's replica (by hash or by binding).
	ReasonSession = "session"
	// ReasonPrefix: the replica holding the longest usable prefix.
	ReasonPrefix = "prefix"
	// ReasonHash: the prefix key's owner on a consistent-hash ring.
	ReasonHash = "hash"
	// ReasonBounded: the owner was over its load bound; the next one took it.
	ReasonBounded = "bounded"
	// ReasonImbalanced: a fleet-wide imbalance gate chose the least loaded.
	ReasonImbalanced = "imbalanced"
	// ReasonSmallestTree: no good match; the replica with the least cached.
	ReasonSmallestTree = "smallest-tree"
	// ReasonLeastCost: the cheapest replica, with no prefix to speak of.
	ReasonLeastCost = "least-cost"
	// ReasonScore: the highest weighted score (llm-d).
	ReasonScore = "score"
	// ReasonReplicate: a replica holding more of the prefix was passed
	// over because its load cost more than computing the prefix again on
	// another, which becomes a second holder.
	ReasonReplicate = "replicate"
	// ReasonTransfer: the prefix is imported from a replica holding more
	// of it (Decision.Transfer), cheaper than recomputing it or waiting
	// for the holder.
	ReasonTransfer = "transfer"
	// ReasonDisagg: a prefill worker computes the prompt and the decode
	// replica receives its KV (Decision.Transfer from the worker), which
	// prices least.
	ReasonDisagg = "disagg"
	// ReasonLocalPrefill: a prefill worker could have taken the prompt, but
	// the decode replica computing it itself prices less.
	ReasonLocalPrefill = "local-prefill"
	// ReasonExploit: Preble's exploitation branch (cached prefix holder).
	ReasonExploit = "exploit"
	// ReasonExplore: Preble's exploration branch (lowest load).
	ReasonExplore = "explore"
	// ReasonRebalance: Preble moved a hot prefix to the lightest replica.
	ReasonRebalance = "rebalance"
	// ReasonLeastRunning: the fewest engine running requests (AIBrix).
	ReasonLeastRunning = "least-running"
	// ReasonLeastTTFT: the least estimated time to first token (Mooncake).
	ReasonLeastTTFT = "least-ttft"
)

// blockSize is the snapshot's tokens per block, DefaultBlockSize when zero.
func blockSize(s *Snapshot) int {
	if s.BlockSize > 0 {
		return s.BlockSize
	}
	return DefaultBlockSize
}

// mix64 is the SplitMix64 finalizer: a cheap, well-mixed bijection of x.
func Mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// tieKey orders replica i for request hash h: the lower key wins a tie.
func tieKey(h uint64, i int) uint64 {
	return Mix64(h ^ (uint64(i)+1)*0x9e3779b97f4a7c15)
}

// matchOf is the number of leading blocks of r resident on replica i.
func matchOf(r *Request, i int) int {
	if i >= 0 && i < len(r.Match) && r.Match[i] > 0 {
		return r.Match[i]
	}
	return 0
}

// ageOf is how long ago replica i last touched r's deepest matched block.
func ageOf(r *Request, i int) time.Duration {
	if i >= 0 && i < len(r.Age) {
		return r.Age[i]
	}
	return 0
}

// ratioOf is the fraction of r's blocks resident on replica i, 0..1.
func ratioOf(r *Request, i int) float64 {
	m := matchOf(r, i)
	if m == 0 || r.Blocks <= 0 {
		return 0
	}
	if m >= r.Blocks {
		return 1
	}
	return float64(m) / float64(r.Blocks)
}

// healthy counts the healthy replicas of s.
func healthy(s *Snapshot) int {
	n := 0
	for i := range s.Replicas {
		if s.Replicas[i].Healthy {
			n++
		}
	}
	return n
}

// nthHealthy is the index of the k-th (from 0) healthy replica, or -1.
func nthHealthy(s *Snapshot, k int) int {
	for i := range s.Replicas {
		if !s.Replicas[i].Healthy {
			continue
		}
		if k == 0 {
			return i
		}
		k--
	}
	return -1
}

// rejected is the decision when no replica is healthy.
func rejected(r *Request) Decision {
	return Decision{Replica: -1, Reason: ReasonNoHealthy, Costs: costsFor(r, 0)}
}

// costsFor returns r.Costs emptied when its capacity holds n candidates,
// else nil (the policy then records no costs).
func costsFor(r *Request, n int) []Cost {
	if r.Costs == nil || cap(r.Costs) < n {
		return nil
	}
	return r.Costs[:0]
}

// chooser keeps the best candidate seen so far: the lowest key, ties broken
// by tieKey of the request hash (deterministic, no random source). It also
// records each candidate's key when costs is non-nil: as Cost.Total in ns
// if timed, else as Cost.Score.
type chooser struct {
	best  int
	key   float64
	hash  uint64
	costs []Cost
	timed bool
}

// newChooser starts an empty choice for request r over n replicas.
func newChooser(r *Request, n int) chooser {
	return chooser{best: -1, hash: r.Hash, costs: costsFor(r, n)}
}

// offer proposes replica i with key (lower is better) and records it.
func (c *chooser) offer(i int, key float64, matched int) {
	if c.costs != nil {
		k := Cost{Replica: i, Matched: matched, Score: key}
		if c.timed {
			k = Cost{Replica: i, Matched: matched, Total: time.Duration(key)}
		}
		c.costs = append(c.costs, k)
	}
	c.consider(i, key)
}

// consider proposes replica i with key without recording a cost.
func (c *chooser) consider(i int, key float64) {
	switch {
	case c.best < 0 || key < c.key:
	case key == c.key && tieKey(c.hash, i) < tieKey(c.hash, c.best):
	default:
		return
	}
	c.best, c.key = i, key
}

// decision is the choice with reason and predicted cached tokens.
func (c *chooser) decision(reason string, matched int) Decision {
	if c.best < 0 {
		return Decision{Replica: -1, Reason: ReasonNoHealthy, Costs: c.costs}
	}
	return Decision{Replica: c.best, Reason: reason, Matched: matched, Costs: c.costs}
}

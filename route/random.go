package route

// Random sends each request to a healthy replica drawn uniformly from a hash
// of Request.Hash (SplitMix64), so the draw is reproducible. It reads no load
// and no residency. Source: docs/peers.md, baseline "random".
type Random struct{}

// Pick chooses healthy[mix(Hash) % n].
func (Random) Pick(r *Request, s *Snapshot) Decision {
	n := healthy(s)
	if n == 0 {
		return rejected(r)
	}
	i := nthHealthy(s, int(Mix64(r.Hash)%uint64(n)))
	return Decision{Replica: i, Reason: ReasonRandom, Matched: matchOf(r, i) * blockSize(s), Costs: costsFor(r, len(s.Replicas))}
}

var _ Policy = Random{}

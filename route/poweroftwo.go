package route

// PowerOfTwo draws two distinct healthy replicas from Request.Hash and sends
// the request to the one with fewer requests in flight (Replica.InFlight);
// on a tie, the first drawn. With one healthy replica it is that one.
// Source: Mitzenmacher, "The Power of Two Choices in Randomized Load
// Balancing" (2001); docs/peers.md baseline "power-of-two".
type PowerOfTwo struct{}

// Pick chooses the less loaded of two hash-drawn replicas.
func (PowerOfTwo) Pick(r *Request, s *Snapshot) Decision {
	n := healthy(s)
	if n == 0 {
		return rejected(r)
	}
	a := int(Mix64(r.Hash) % uint64(n))
	b := a
	if n > 1 {
		b = int(Mix64(r.Hash+0x9e3779b97f4a7c15) % uint64(n-1))
		if b >= a {
			b++
		}
	}
	i, j := nthHealthy(s, a), nthHealthy(s, b)
	costs := costsFor(r, len(s.Replicas))
	if costs != nil {
		costs = append(costs, Cost{Replica: i, Score: float64(s.Replicas[i].InFlight)})
		if j != i {
			costs = append(costs, Cost{Replica: j, Score: float64(s.Replicas[j].InFlight)})
		}
	}
	if s.Replicas[j].InFlight < s.Replicas[i].InFlight {
		i = j
	}
	return Decision{Replica: i, Reason: ReasonPowerOfTwo, Matched: matchOf(r, i) * blockSize(s), Costs: costs}
}

var _ Policy = PowerOfTwo{}

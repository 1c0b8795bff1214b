package route

// RoundRobin sends request Seq to the (Seq mod n)-th healthy replica, as a
// Kubernetes Service or a plain load balancer does. It reads no load and no
// residency. Source: docs/peers.md, baseline "round-robin".
type RoundRobin struct{}

// Pick chooses healthy[Seq % n].
func (RoundRobin) Pick(r *Request, s *Snapshot) Decision {
	n := healthy(s)
	if n == 0 {
		return rejected(r)
	}
	i := nthHealthy(s, int(r.Seq%uint64(n)))
	return Decision{Replica: i, Reason: ReasonRoundRobin, Matched: matchOf(r, i) * blockSize(s), Costs: costsFor(r, len(s.Replicas))}
}

var _ Policy = RoundRobin{}

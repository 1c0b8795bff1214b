package route

// LeastLoaded sends each request to the healthy replica with the fewest
// requests in flight as counted by the router itself (Replica.InFlight,
// always fresh); ties go to the lowest tieKey of Request.Hash. Source:
// KubeAI's default load balancing strategy LeastLoad
// (internal/loadbalancer/balance_least_load.go, getAddrLeastLoad, at
// substratusai/kubeai commit a23c497: the endpoint with the fewest
// requests in flight, ties to the first in its map's order), docs/peers.md
// baseline "least-loaded".
type LeastLoaded struct{}

// Pick chooses the minimum InFlight.
func (LeastLoaded) Pick(r *Request, s *Snapshot) Decision {
	c := newChooser(r, len(s.Replicas))
	for i := range s.Replicas {
		if s.Replicas[i].Healthy {
			c.offer(i, float64(s.Replicas[i].InFlight), 0)
		}
	}
	return c.decision(ReasonLeastLoaded, matchOf(r, c.best)*blockSize(s))
}

var _ Policy = LeastLoaded{}

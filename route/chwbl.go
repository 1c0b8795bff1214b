package route

// CHWBL is consistent hashing with bounded loads on the prompt prefix.
//
// Source: KubeAI PrefixHash load balancing (internal/loadbalancer/
// balance_chwbl.go, kubeai v0.18): the key is the first 100 characters of
// the first user message (or prompt) plus the LoRA adapter name
// (Request.PrefixKey, computed by the caller with xxhash64); xxhash64 of it
// onto a ring of 256 virtual nodes per replica; walk clockwise to the first
// replica whose own in-flight load passes chwblLoadOK: with
// avg = (total in-flight + 1) / N, load + 1 ≤ avg × LoadFactor (KubeAI's
// "+1" counts the request being routed); no replica qualifies → the first
// one on the ring. Defaults: LoadFactor 1.25, 256 vnodes.
//
// Emulation: instead of a 256-vnode ring (which a pure policy would have to
// rebuild on every call, or keep in a constructor-built struct that goes
// stale when replicas change), this uses rendezvous hashing: the replicas
// ordered by mix(PrefixKey ^ xxhash64(ID)) form a uniformly random,
// key-consistent permutation, just as the ring's walk order does (the ring
// with 256 vnodes approximates it); "first on the walk that passes the bound"
// becomes "highest score that passes the bound". Load balance, bounded
// overload and minimal disruption are the same; the exact replica chosen for
// a given key differs from KubeAI's. It reads no residency.
type CHWBL struct {
	// LoadFactor bounds a replica's load relative to the mean; zero means
	// KubeAI's default 1.25.
	LoadFactor float64
}

// Pick chooses the highest-scoring replica within the load bound.
func (p CHWBL) Pick(r *Request, s *Snapshot) Decision {
	f := p.LoadFactor
	if f <= 0 {
		f = 1.25
	}
	n, total := 0, 0
	for i := range s.Replicas {
		if s.Replicas[i].Healthy {
			n++
			total += s.Replicas[i].InFlight
		}
	}
	if n == 0 {
		return rejected(r)
	}
	bound := -1.0
	if total > 0 {
		bound = float64(total+1) / float64(n) * f
	}
	owner, i := hrw(s, r.PrefixKey, bound)
	reason := ReasonHash
	switch {
	case i < 0:
		i = owner
	case i != owner:
		reason = ReasonBounded
	}
	return Decision{Replica: i, Reason: reason, Matched: matchOf(r, i) * blockSize(s), Costs: costsFor(r, len(s.Replicas))}
}

var _ Policy = CHWBL{}

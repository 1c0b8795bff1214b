package route

// ShareMemory is about how many of the router's latest decisions a
// replica's Share and a Snapshot's Seqs average over, on a fleet of n
// replicas: sixteen of a replica's own requests at an even share, so
// that a share's noise is about a quarter of it.
func ShareMemory(n int) float64 { return 16 * float64(max(n, 1)) }

// ShareAt is rp's Share as of decision seq on a fleet of n replicas: each
// decision since ShareSeq that sent it nothing took 1/ShareMemory of it.
func (rp *Replica) ShareAt(seq uint64, n int) float64 {
	if rp.Share <= 0 || seq <= rp.ShareSeq {
		return max(rp.Share, 0)
	}
	return rp.Share * expNeg(float64(seq-rp.ShareSeq)/ShareMemory(n))
}

// Arrived is the Share of a replica that the decision numbered seq sent
// a request, whose Share was share as of decision prev: an exponentially
// weighted mean of the decisions that sent it one.
func Arrived(share float64, prev, seq uint64, n int) float64 {
	rp := Replica{Share: share, ShareSeq: prev}
	return rp.ShareAt(seq, n) + 1/ShareMemory(n)
}

// Averaged is the mean of a quantity, mean so far, after one more
// decision saw x, on a fleet of n replicas (Snapshot.Seqs).
func Averaged(mean, x float64, n int) float64 {
	return mean + (x-mean)/ShareMemory(n)
}

package route

import (
	"math"
	"time"
)

// timing is a replica's Rates as float64 nanoseconds with defaults filled,
// with the Rates it was built from (all but Horizon and Scale, which it
// ignores; the scan applies each replica's Scale).
type timing struct {
	perTok, attn, step, perSeq, maxSeqs, invSeqs float64
	slot                                         float64 // step + maxSeqs×perSeq: step(MaxSeqs)
	// busyAt is the least occupancy with float64(occupancy) − maxSeqs + 1
	// > 0 (the batch is full), so that the scan compares integers.
	busyAt int

	// The Rates fields t was built from.
	prefillPerToken, attnPerToken2, decodeStep, decodePerSeq time.Duration
	maxSeqsKey                                               int
}

// same reports whether t was built from Rates equal to rt in every field it
// reads: one branch, for a compare per replica.
func (t *timing) same(rt *Rates) bool {
	return (rt.PrefillPerToken^t.prefillPerToken)|(rt.AttnPerMPairs^t.attnPerToken2)|
		(rt.DecodeStep^t.decodeStep)|(rt.DecodePerSeq^t.decodePerSeq)|time.Duration(rt.MaxSeqs^t.maxSeqsKey) == 0
}

// set fills t from rt with defaults, as Rates.withDefaults does, in
// float64 (in place: building and copying a struct here costs more than all
// the arithmetic of a Pick).
func (t *timing) set(rt *Rates) {
	t.perTok, t.attn, t.step, t.perSeq, t.maxSeqs, t.invSeqs = float64(DefaultPrefillPerToken),
		float64(DefaultAttnPerMPairs)*1e-6, float64(DefaultDecodeStep), float64(DefaultDecodePerSeq),
		DefaultMaxSeqs, 1.0/DefaultMaxSeqs
	if rt.PrefillPerToken > 0 {
		t.perTok = float64(rt.PrefillPerToken)
	}
	if rt.AttnPerMPairs > 0 {
		t.attn = float64(rt.AttnPerMPairs) * 1e-6
	}
	if rt.DecodeStep > 0 {
		t.step = float64(rt.DecodeStep)
	}
	if rt.DecodePerSeq > 0 {
		t.perSeq = float64(rt.DecodePerSeq)
	}
	if rt.MaxSeqs > 0 && rt.MaxSeqs != DefaultMaxSeqs {
		t.maxSeqs = float64(rt.MaxSeqs)
		t.invSeqs = 1 / t.maxSeqs
	}
	t.slot = t.step + t.maxSeqs*t.perSeq
	t.busyAt = busyAt(t.maxSeqs)
	t.prefillPerToken, t.attnPerToken2, t.decodeStep, t.decodePerSeq, t.maxSeqsKey =
		rt.PrefillPerToken, rt.AttnPerMPairs, rt.DecodeStep, rt.DecodePerSeq, rt.MaxSeqs
}

// busyAt is the least int n with float64(n) − maxSeqs + 1 > 0 (a monotone
// test in n), for maxSeqs an int ≥ 1 as a float64. Up to 2^52 it is
// maxSeqs itself: float64(n) − maxSeqs and + 1 are exact near 0, and far
// from 0 rounding keeps the sign. Beyond, a binary search.
func busyAt(maxSeqs float64) int {
	if maxSeqs >= 1 && maxSeqs <= 1<<52 {
		return int(maxSeqs)
	}
	lo, hi := math.MinInt, math.MaxInt // the test fails at lo and holds at hi
	for lo < hi-1 {
		mid := lo + int(uint64(hi-lo)/2) // hi−lo wraps, as uint64 it is exact
		if float64(mid)-maxSeqs+1 > 0 {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// prefill is the prefill time of n new tokens after c cached, in ns.
func (t *timing) prefill(n, c float64) float64 {
	return n*t.perTok + n*(c+n/2)*t.attn
}

package route

import (
	"math"
	"time"
)

// Defaults of the llama3-8b-h100 preset, used for every zero field of Rates.
// They come from public figures for Llama-3-8B in bf16 on one H100 SXM
// (about 16 GFLOP per token of dense compute at ~400 TFLOP/s effective, so
// ~25,000 prompt tokens/s at short context; decode steps of 10-30 ms
// depending on the batch). The engine model's engine.Config.Rates() supplies
// the preset's exact figures; route does not import engine.
const (
	// DefaultPrefillPerToken is the prefill time of one prompt token at short
	// context: 40 µs, i.e. 25,000 tokens/s.
	DefaultPrefillPerToken = 40 * time.Microsecond
	// DefaultAttnPerToken2 is the attention term in the units of
	// Rates.AttnPerToken2: 1.3 ms there means 1.3 ns per (token, context
	// token) pair (4 × 32 layers × 4096 dims of QK and AV FLOPs at the same
	// effective rate).
	DefaultAttnPerToken2 = 1300 * time.Microsecond
	// DefaultDecodeStep is the duration of one decode step of a small batch.
	DefaultDecodeStep = 15 * time.Millisecond
	// DefaultDecodePerSeq is the extra decode step time per running sequence.
	DefaultDecodePerSeq = 100 * time.Microsecond
	// DefaultMaxSeqs is vLLM's default max_num_seqs.
	DefaultMaxSeqs = 256
	// DefaultBlockSize is tokens per block when Snapshot.BlockSize is zero.
	DefaultBlockSize = 16
)

// withDefaults returns r with every zero field replaced by its default.
// Horizon stays zero (no decay) and Scale zero becomes 1.
func (r Rates) withDefaults() Rates {
	if r.PrefillPerToken <= 0 {
		r.PrefillPerToken = DefaultPrefillPerToken
	}
	if r.AttnPerToken2 <= 0 {
		r.AttnPerToken2 = DefaultAttnPerToken2
	}
	if r.DecodeStep <= 0 {
		r.DecodeStep = DefaultDecodeStep
	}
	if r.DecodePerSeq <= 0 {
		r.DecodePerSeq = DefaultDecodePerSeq
	}
	if r.MaxSeqs <= 0 {
		r.MaxSeqs = DefaultMaxSeqs
	}
	if r.Scale <= 0 {
		r.Scale = 1
	}
	return r
}

// prefillTime is the time to prefill n new tokens after c cached ones:
// n×PrefillPerToken + n×(c+n/2)×AttnPerToken2/1e6 (see Rates). r must have
// its defaults filled.
func (r *Rates) prefillTime(n, c int) time.Duration {
	if n <= 0 {
		return 0
	}
	lin := time.Duration(n) * r.PrefillPerToken
	pairs := float64(n) * (float64(c) + float64(n)/2)
	return lin + time.Duration(pairs*float64(r.AttnPerToken2)/1e6)
}

// stepTime is the duration of one decode step with batch running sequences.
func (r *Rates) stepTime(batch int) time.Duration {
	return r.DecodeStep + time.Duration(batch)*r.DecodePerSeq
}

// residency is the probability that a prefix last touched age ago on a
// replica with eviction horizon h is still cached: exp(−age/h); 1 when h or
// age is not positive.
func residency(age, h time.Duration) float64 {
	if h <= 0 || age <= 0 {
		return 1
	}
	return expNeg(float64(age) / float64(h))
}

// expNeg is exp(−x) for x ≥ 0 to a relative error below 1e-6 (plenty for a
// probability), several times cheaper than math.Exp: exp(−x) = 2^−n ×
// exp(−t) with n = x·log2 e rounded and t = x − n·ln 2 in [−ln 2/2, ln 2/2],
// the last by a degree-6 Taylor polynomial (error below 2e-7) evaluated by
// Estrin's scheme, so that its multiplications overlap.
func expNeg(x float64) float64 {
	if x >= 700 {
		return 0
	}
	n := float64(int64(x*math.Log2E + 0.5)) // x ≥ 0: truncation rounds
	t := x - n*math.Ln2
	t2 := t * t
	p := (1 - t) + t2*(1.0/2-t*(1.0/6)) + t2*t2*((1.0/24-t*(1.0/120))+t2*(1.0/720))
	return math.Float64frombits(math.Float64bits(p) - uint64(n)<<52)
}

// scaled multiplies d by s (a Rates.Scale with defaults filled).
func scaled(d time.Duration, s float64) time.Duration {
	if s == 1 {
		return d
	}
	return time.Duration(float64(d) * s)
}

package route

import (
	"math"
	"time"
)

// Defaults of the llama3-8b-h100 preset (Llama-3.1-8B in bf16 on one H100
// SXM; engine/preset.go derives each from public figures), used for every
// zero field of Rates. They equal engine.Config{}.Rates(), which a test of
// package engine checks; route does not import engine.
const (
	// DefaultPrefillPerToken is the prefill time of one prompt token at short
	// context: 46 µs, about 21,700 tokens/s.
	DefaultPrefillPerToken = 46 * time.Microsecond
	// DefaultAttnPerMPairs is the attention time per million (token,
	// context token) pairs: 1.5 ns a pair.
	DefaultAttnPerMPairs = 1500 * time.Microsecond
	// DefaultDecodeStep is one decode iteration of a batch of one: 1.5 ms
	// of step overhead and 6.8 ms to read the weights.
	DefaultDecodeStep = 8300 * time.Microsecond
	// DefaultStepOverhead is that 1.5 ms: what an iteration with no decode
	// takes beside its prefill's compute.
	DefaultStepOverhead = 1500 * time.Microsecond
	// DefaultDecodePerSeq is the extra decode iteration time per sequence.
	DefaultDecodePerSeq = 60 * time.Microsecond
	// DefaultDecodePerMTokens is the extra decode iteration time per
	// million tokens of context (reading their KV).
	DefaultDecodePerMTokens = 56 * time.Millisecond
	// DefaultMaxSeqs is vLLM's default max_num_seqs.
	DefaultMaxSeqs = 256
	// DefaultMaxBatchedTokens is vLLM's default max_num_batched_tokens.
	DefaultMaxBatchedTokens = 8192
	// DefaultBlockSize is tokens per block when Snapshot.BlockSize is zero.
	DefaultBlockSize = 16
)

// WithDefaults returns r with every zero field replaced by its default.
// Horizon stays zero (no decay) and Scale zero becomes 1.
func (r Rates) WithDefaults() Rates {
	if r.PrefillPerToken <= 0 {
		r.PrefillPerToken = DefaultPrefillPerToken
	}
	if r.AttnPerMPairs <= 0 {
		r.AttnPerMPairs = DefaultAttnPerMPairs
	}
	if r.DecodeStep <= 0 {
		r.DecodeStep = DefaultDecodeStep
	}
	if r.StepOverhead <= 0 {
		r.StepOverhead = DefaultStepOverhead
	}
	r.StepOverhead = min(r.StepOverhead, r.DecodeStep)
	if r.DecodePerSeq <= 0 {
		r.DecodePerSeq = DefaultDecodePerSeq
	}
	if r.DecodePerMTokens <= 0 {
		r.DecodePerMTokens = DefaultDecodePerMTokens
	}
	if r.MaxSeqs <= 0 {
		r.MaxSeqs = DefaultMaxSeqs
	}
	if r.MaxBatchedTokens <= 0 {
		r.MaxBatchedTokens = DefaultMaxBatchedTokens
	}
	if r.DecodeScale <= 0 {
		r.DecodeScale = 1
	}
	if r.Scale <= 0 {
		r.Scale = 1
	}
	if r.HitScale <= 0 {
		r.HitScale = 1
	}
	return r
}

// resident is the probability that a prefix last touched age ago on a
// replica is still cached, given the replica's eviction horizon h (the
// time its misses take to fill the cache) and its capacity in tokens.
//
// Under LRU, a block survives while the tokens stored since it was last
// touched stay below the cache's capacity. At a steady miss rate that is a
// step at h; what blurs the step is that misses come in requests. If the
// cache holds n prompts of this size (capacity / tokens), the tokens
// stored over age = x·h are about n·x prompts' worth, with a spread of
// √(n·x) prompts (Poisson arrivals), so the survival probability is
//
//	Φ((1 − x)·√(n/x))
//
// (Φ the standard normal distribution, to within 1% by the logistic
// 1/(1 + e^(−1.702 z))). A large cache of small prompts survives nearly
// to h and not beyond; a cache of a few long prompts has a soft edge. It
// is 1 when h or age is not positive, and a plain step at h when the
// capacity or the prompt is unknown.
func resident(age, h time.Duration, capacity, tokens float64) float64 {
	if h <= 0 || age <= 0 {
		return 1
	}
	x := float64(age) / float64(h)
	if capacity <= 0 || tokens <= 0 {
		switch {
		case x < 1:
			return 1
		case x == 1:
			return 0.5
		}
		return 0
	}
	z := 1.702 * (1 - x) * math.Sqrt(capacity/tokens/x)
	if z >= 0 {
		return 1 / (1 + expNeg(z))
	}
	e := expNeg(-z)
	return e / (1 + e)
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

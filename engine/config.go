package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/slots"
)

// Idle is the next wake-up Step returns when the engine has no work: call
// Step again only after Add.
const Idle time.Duration = 1<<63 - 1

// Engine kinds (Config.Kind).
const (
	// KindVLLM is vLLM's engine: a paged KV cache with automatic prefix
	// caching over blocks.
	KindVLLM = "vllm"
	// KindLlamaCpp is llama.cpp's llama-server: MaxNumSeqs slots that each
	// keep their last prompt, picked by longest common prefix, and a host
	// prompt cache (package slots; llamacpp.go).
	KindLlamaCpp = "llamacpp"
)

// Config sizes one engine and sets its timing model. Zero values mean the
// llama3-8b-h100 preset's figure for sizes and timing, so Config{} is a
// working Llama-3.1-8B on one H100.
type Config struct {
	// BlockSize is tokens per KV block; zero means 16 (vLLM's default).
	BlockSize int
	// NumBlocks is the KV capacity in blocks; zero means 28160 (about 450k
	// tokens, llama3-8b-h100).
	NumBlocks int
	// MaxNumSeqs caps the running batch (vLLM max_num_seqs); zero means 256.
	MaxNumSeqs int
	// MaxBatchedTokens is the per-step token budget (vLLM
	// max_num_batched_tokens); zero means 8192.
	MaxBatchedTokens int
	// MaxModelLen caps prompt plus output tokens per request; zero means
	// 131072 (Llama 3.1), further capped by the whole cache.
	MaxModelLen int
	// NoTokenEvents suppresses the per-token Token events (FirstToken and
	// Done are still emitted); the simulator sets it to run faster.
	NoTokenEvents bool
	// KVBytesPerToken is the KV footprint of one token across all GPUs of
	// the replica, in bytes; zero means 131072 (Llama-3-8B, bf16). The model
	// uses it only to report memory; NumBlocks sets the capacity.
	KVBytesPerToken int
	// CPUBlocks is the capacity, in blocks, of the host-memory offload
	// tier (see tier); zero means none, as a vLLM without a KV connector.
	CPUBlocks int
	// PCIeGBps is the host-to-device bandwidth in GB/s (10⁹ bytes per
	// second) at which blocks load back from the CPU tier; zero means
	// DefaultPCIeGBps.
	PCIeGBps float64
	// InterconnectGBps is the bandwidth, in GB/s each way, at which the
	// replica sends KV blocks to and receives them from its peers
	// (Request.RemoteBlocks; the RDMA NICs a KV connector such as NIXL
	// uses); zero means the preset's (one 400 Gb/s NIC per GPU, 50 GB/s).
	InterconnectGBps float64
	// Kind is the engine modelled: KindVLLM or KindLlamaCpp; empty means
	// KindVLLM. A llama.cpp engine runs MaxNumSeqs slots (-np) sharing
	// NumBlocks × BlockSize tokens of context (-c): each slot's context,
	// and so the longest request, is that over MaxNumSeqs.
	Kind string
	// SlotSimilarity is a llama.cpp engine's --slot-prompt-similarity;
	// zero means slots.DefaultSimilarity (0.1).
	SlotSimilarity float64
	// HostCacheTokens bounds a llama.cpp engine's host prompt cache
	// (--cache-ram), in tokens; zero means 8 GiB (llama-server's default)
	// of KVBytesPerToken each.
	HostCacheTokens int
	// Root is the hash the engine's block chains start from (before the
	// LoRA name is folded in). It need not equal the router's root: the
	// engine hashes its own blocks, as vLLM does.
	Root prefix.Hash

	// StepOverhead is the fixed cost of every iteration (scheduling, kernel
	// launch, sampling); zero means the preset's.
	StepOverhead time.Duration
	// PrefillPerToken is the linear cost of prefilling one token (the
	// weights' FLOPs); zero means the preset's.
	PrefillPerToken time.Duration
	// AttnPerMPairs is the attention cost per million (token, context
	// token) pairs, as route.Rates.AttnPerMPairs: a chunk of n tokens after
	// c computed ones costs n*(c+n/2)*AttnPerMPairs/1e6.
	// Zero means the preset's.
	AttnPerMPairs time.Duration
	// DecodeStep is added to an iteration that decodes at least one
	// sequence (reading the weights once); zero means the preset's.
	DecodeStep time.Duration
	// DecodePerSeq is added per decoding sequence; zero means the preset's.
	DecodePerSeq time.Duration
	// DecodePerMTokens is added per million tokens of context of the
	// decoding sequences (reading their KV); zero means the preset's.
	DecodePerMTokens time.Duration
}

// defaults returns c with every zero field set.
func (c Config) defaults() Config {
	p := llama8B()
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.BlockSize, 16)
	def(&c.NumBlocks, p.NumBlocks*16/c.BlockSize)
	def(&c.MaxNumSeqs, 256)
	if c.Kind == KindLlamaCpp {
		def(&c.MaxBatchedTokens, 2048) // llama-server's -b
	}
	def(&c.MaxBatchedTokens, 8192)
	def(&c.MaxModelLen, p.MaxModelLen)
	def(&c.KVBytesPerToken, p.KVBytesPerToken)
	if c.PCIeGBps == 0 {
		c.PCIeGBps = DefaultPCIeGBps
	}
	if c.InterconnectGBps == 0 {
		c.InterconnectGBps = p.InterconnectGBps
	}
	defD(&c.StepOverhead, p.StepOverhead)
	defD(&c.PrefillPerToken, p.PrefillPerToken)
	defD(&c.AttnPerMPairs, p.AttnPerMPairs)
	defD(&c.DecodeStep, p.DecodeStep)
	defD(&c.DecodePerSeq, p.DecodePerSeq)
	defD(&c.DecodePerMTokens, p.DecodePerMTokens)
	m := c.NumBlocks * c.BlockSize
	if c.Kind == KindLlamaCpp {
		m /= max(c.MaxNumSeqs, 1) // a slot's context
		if c.SlotSimilarity == 0 {
			c.SlotSimilarity = slots.DefaultSimilarity
		}
		if c.HostCacheTokens == 0 {
			c.HostCacheTokens = int(min(defaultCacheRAM/int64(max(c.KVBytesPerToken, 1)), 1<<40))
		}
	}
	if c.MaxModelLen > m {
		c.MaxModelLen = m
	}
	return c
}

// defaultCacheRAM is llama-server's --cache-ram default, 8192 MiB.
const defaultCacheRAM int64 = 8 << 30

// validate reports a config with negative or inconsistent figures.
func (c Config) validate() error {
	switch {
	case c.Kind != "" && c.Kind != KindVLLM && c.Kind != KindLlamaCpp:
		return fmt.Errorf("engine config: kind %q, want %s or %s", c.Kind, KindVLLM, KindLlamaCpp)
	case c.SlotSimilarity < 0 || c.SlotSimilarity >= 1 || c.HostCacheTokens < 0:
		return fmt.Errorf("engine config: slot similarity %g (want 0..1) or host cache %d tokens out of range", c.SlotSimilarity, c.HostCacheTokens)
	case c.BlockSize < 1:
		return fmt.Errorf("engine config: block size %d < 1", c.BlockSize)
	case c.NumBlocks < 1:
		return fmt.Errorf("engine config: %d blocks < 1", c.NumBlocks)
	case c.NumBlocks >= 1<<31-1:
		return fmt.Errorf("engine config: %d blocks is too many", c.NumBlocks)
	case c.MaxNumSeqs < 1:
		return fmt.Errorf("engine config: max num seqs %d < 1", c.MaxNumSeqs)
	case c.MaxBatchedTokens < 1:
		return fmt.Errorf("engine config: max batched tokens %d < 1", c.MaxBatchedTokens)
	case c.MaxModelLen < 2:
		return fmt.Errorf("engine config: max model len %d < 2", c.MaxModelLen)
	case c.CPUBlocks < 0 || c.CPUBlocks >= 1<<31-1:
		return fmt.Errorf("engine config: %d CPU blocks out of range", c.CPUBlocks)
	case !(c.PCIeGBps > 0) || c.PCIeGBps > 1e6:
		return fmt.Errorf("engine config: PCIe bandwidth %g GB/s out of range", c.PCIeGBps)
	case !(c.InterconnectGBps > 0) || c.InterconnectGBps > 1e6:
		return fmt.Errorf("engine config: interconnect bandwidth %g GB/s out of range", c.InterconnectGBps)
	case c.StepOverhead < 0 || c.PrefillPerToken < 0 || c.AttnPerMPairs < 0 ||
		c.DecodeStep < 0 || c.DecodePerSeq < 0 || c.DecodePerMTokens < 0:
		return fmt.Errorf("engine config: negative timing figure")
	}
	return nil
}

// blockLoad is the time one KV block takes over the PCIe link.
func (c *Config) blockLoad() time.Duration { return c.blockTime(c.PCIeGBps) }

// BlockTransfer is the time one KV block takes over the interconnect
// (InterconnectGBps). Zero fields of c take their defaults.
func (c Config) BlockTransfer() time.Duration {
	c = c.defaults()
	return c.blockTime(c.InterconnectGBps)
}

// TransferPerMTokens is the time a million tokens of KV take over the
// interconnect (route.Rates.TransferPerMTokens). Zero fields of c take
// their defaults.
func (c Config) TransferPerMTokens() time.Duration {
	c = c.defaults()
	return time.Duration(1e6 * float64(c.KVBytesPerToken) / (c.InterconnectGBps * 1e9) * float64(time.Second))
}

// LoadPerMTokens is the time a million tokens of KV take to load from the
// CPU tier (route.Rates.LoadPerMTokens). Zero fields of c take their
// defaults.
func (c Config) LoadPerMTokens() time.Duration {
	c = c.defaults()
	return time.Duration(1e6 * float64(c.KVBytesPerToken) / (c.PCIeGBps * 1e9) * float64(time.Second))
}

// BlockBytes is the size of one KV block, in bytes; c's defaults must be
// filled.
func (c *Config) BlockBytes() int64 { return int64(c.BlockSize) * int64(c.KVBytesPerToken) }

// blockTime is the time one block takes over a link of gbps GB/s.
func (c *Config) blockTime(gbps float64) time.Duration {
	return time.Duration(float64(c.BlockBytes()) / (gbps * 1e9) * float64(time.Second))
}

// CheckLength reports why an engine of this configuration refuses, for its
// size, a request of prompt tokens generating up to maxTokens: an empty
// prompt, maxTokens < 1, or prompt plus output longer than MaxModelLen or
// than the whole KV cache. It returns nil for a request that fits; Add
// applies the same rule. Zero fields of c take their defaults.
func (c Config) CheckLength(prompt, maxTokens int) error {
	c = c.defaults()
	return c.checkLength(prompt, maxTokens)
}

// checkLength is CheckLength on a config whose defaults are filled.
func (c *Config) checkLength(prompt, maxTokens int) error {
	bs := c.BlockSize
	switch {
	case prompt < 1:
		return errors.New("empty prompt")
	case maxTokens < 1:
		return fmt.Errorf("max tokens %d < 1", maxTokens)
	case prompt+maxTokens > c.MaxModelLen:
		return fmt.Errorf("%d prompt + %d output tokens exceed the max model length %d", prompt, maxTokens, c.MaxModelLen)
	case (prompt+maxTokens+bs-1)/bs > c.NumBlocks:
		return fmt.Errorf("%d tokens exceed the KV cache of %d blocks", prompt+maxTokens, c.NumBlocks)
	}
	return nil
}

// Rates converts the timing model to the router's units, so the router's
// cost model starts from the same preset. DecodeStep includes the step
// overhead.
func (c Config) Rates() route.Rates {
	c = c.defaults()
	return route.Rates{
		PrefillPerToken:  c.PrefillPerToken,
		AttnPerMPairs:    c.AttnPerMPairs,
		DecodeStep:       c.StepOverhead + c.DecodeStep,
		StepOverhead:     c.StepOverhead,
		DecodePerSeq:     c.DecodePerSeq,
		DecodePerMTokens: c.DecodePerMTokens,
		MaxSeqs:          c.MaxNumSeqs,
		MaxBatchedTokens: c.MaxBatchedTokens,
	}
}

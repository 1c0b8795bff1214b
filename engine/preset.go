package engine

import (
	"fmt"
	"slices"
	"time"
)

// Public figures the presets derive from.
//
// H100 SXM5 80GB: 80 GiB HBM3 at 3.35 TB/s, 989 TFLOPS dense bf16
// (NVIDIA H100 datasheet, nvidia.com/en-us/data-center/h100).
//
// KV capacity follows vLLM's profiling (vllm/v1/worker/gpu_worker.py,
// determine_available_memory): gpu_memory_utilization (default 0.9) times
// the GPU memory, minus the weights, minus the peak activation memory and
// CUDA graphs (about 2 GiB per GPU for these models in vLLM's startup logs),
// divided by the KV bytes per token. KV bytes per token are
// layers × kv_heads × head_dim × 2 (K and V) × 2 bytes (bf16), from each
// model's config.json on Hugging Face.
//
// Prefill is compute-bound: 2 × params FLOPs per token at about 35% of peak
// bf16 (model FLOPs utilisation typical of vLLM prefill; vLLM benchmarks
// report 15-30k prompt tokens/s for an 8B model on one H100). Attention adds
// 4 × layers × q_dim FLOPs per (token, context token) pair at the same
// utilisation. Decode is bandwidth-bound: one read of the weights per step
// at about 70% of HBM bandwidth plus scheduling and sampling overhead (vLLM
// reports inter-token latencies of 6-10 ms at batch 1 for 8B on H100), plus
// a read of every decoding sequence's KV per step.
const (
	gib = 1 << 30
	kib = 1 << 10
	// h100Mem is the memory of one H100 SXM5 80GB, in bytes.
	h100Mem = 80 * gib
	// gpuUtil is vLLM's default gpu_memory_utilization.
	gpuUtil = 0.9
	// activations is the per-GPU memory vLLM reserves for activations and
	// CUDA graphs, in bytes.
	activations = 2 * gib
)

// kvBlocks is the KV capacity in blocks of 16 tokens of gpus H100s holding
// weights bytes of weights, at kvPerToken bytes per token.
func kvBlocks(gpus int, weights float64, kvPerToken int) int {
	free := gpuUtil*float64(gpus*h100Mem) - weights - float64(gpus*activations)
	return int(free / float64(kvPerToken) / 16)
}

// llama8B is Llama-3.1-8B-Instruct on one H100, bf16.
func llama8B() Config {
	// config.json: 32 layers, 8 KV heads, head_dim 128 → 32·8·128·2·2 =
	// 131072 B = 128 KiB per token. 8.03e9 params → 16.06e9 B of weights.
	// kvBlocks: 0.9·80 GiB − 16.06e9 B − 2 GiB ≈ 55 GiB ≈ 450k tokens.
	return Config{
		BlockSize:        16,
		NumBlocks:        kvBlocks(1, 16.06e9, 128*kib),
		MaxNumSeqs:       256,
		MaxBatchedTokens: 8192,
		// max_position_embeddings of Llama 3.1.
		MaxModelLen:     131072,
		KVBytesPerToken: 128 * kib,
		// One 400 Gb/s RDMA NIC per GPU (ConnectX-7, as in DGX H100).
		InterconnectGBps: 50,
		// 1-2 ms of scheduler, launch and sampling per step (vLLM v1 blog:
		// blog.vllm.ai/2025/01/27/v1-alpha-release.html).
		StepOverhead: 1500 * time.Microsecond,
		// 16.06 GFLOP/token at 35% of 989 TFLOPS = 346 TFLOPS → 46 µs
		// (≈ 21.6k tokens/s).
		PrefillPerToken: 46 * time.Microsecond,
		// 4·32·4096 = 524k FLOP per pair / 346 TFLOPS = 1.5 ns per pair.
		AttnPerMPairs: 1_500_000,
		// 16.06e9 B / (0.7 · 3.35 TB/s) ≈ 6.8 ms.
		DecodeStep: 6800 * time.Microsecond,
		// 16.06 GFLOP per sequence at ~35% of peak, rounded up for the
		// less efficient small-M GEMMs of decode.
		DecodePerSeq: 60 * time.Microsecond,
		// 1e6 tokens · 131072 B / (0.7 · 3.35 TB/s) ≈ 56 ms.
		DecodePerMTokens: 56 * time.Millisecond,
	}
}

// llama70B is Llama-3.1-70B-Instruct on 8 H100s, tensor parallel 8, bf16.
func llama70B() Config {
	// config.json: 80 layers, 8 KV heads, head_dim 128 → 327680 B = 320
	// KiB per token. 70.6e9 params → 141.2e9 B. kvBlocks: 0.9·640 GiB −
	// 141.2e9 B − 16 GiB ≈ 428 GiB ≈ 1.4M tokens.
	return Config{
		BlockSize:        16,
		NumBlocks:        kvBlocks(8, 141.2e9, 320*kib),
		MaxNumSeqs:       256,
		MaxBatchedTokens: 8192,
		MaxModelLen:      131072,
		KVBytesPerToken:  320 * kib,
		InterconnectGBps: 8 * 50,
		// Tensor-parallel all-reduces add to the per-step overhead.
		StepOverhead: 2500 * time.Microsecond,
		// 141.2 GFLOP/token at 30% of 8·989 TFLOPS (TP=8 communication
		// lowers utilisation) = 2.37 PFLOPS → 60 µs (≈ 17k tokens/s).
		PrefillPerToken: 60 * time.Microsecond,
		// 4·80·8192 = 2.6M FLOP per pair / 2.37 PFLOPS = 1.1 ns.
		AttnPerMPairs: 1_100_000,
		// 141.2e9 B / (0.6 · 8 · 3.35 TB/s) ≈ 8.8 ms.
		DecodeStep:   8800 * time.Microsecond,
		DecodePerSeq: 100 * time.Microsecond,
		// 1e6 · 327680 B / (0.6 · 26.8 TB/s) ≈ 20 ms.
		DecodePerMTokens: 20 * time.Millisecond,
	}
}

// qwen32B is Qwen3-32B on 2 H100s, tensor parallel 2, bf16.
func qwen32B() Config {
	// config.json: 64 layers, 8 KV heads, head_dim 128 → 262144 B = 256 KiB
	// per token. 32.8e9 params → 65.6e9 B. kvBlocks: 0.9·160 GiB − 65.6e9 B
	// − 4 GiB ≈ 79 GiB ≈ 323k tokens.
	return Config{
		BlockSize:        16,
		NumBlocks:        kvBlocks(2, 65.6e9, 256*kib),
		MaxNumSeqs:       256,
		MaxBatchedTokens: 8192,
		// max_position_embeddings of Qwen3-32B (without YaRN).
		MaxModelLen:      40960,
		KVBytesPerToken:  256 * kib,
		InterconnectGBps: 2 * 50,
		StepOverhead:     2000 * time.Microsecond,
		// 65.6 GFLOP/token at 35% of 2·989 TFLOPS = 692 TFLOPS → 95 µs
		// (≈ 10.5k tokens/s).
		PrefillPerToken: 95 * time.Microsecond,
		// 4·64·8192 (64 query heads × 128) = 2.1M FLOP per pair / 692
		// TFLOPS = 3 ns.
		AttnPerMPairs: 3_000_000,
		// 65.6e9 B / (0.7 · 6.7 TB/s) ≈ 14 ms.
		DecodeStep:   14 * time.Millisecond,
		DecodePerSeq: 100 * time.Microsecond,
		// 1e6 · 262144 B / (0.7 · 6.7 TB/s) ≈ 56 ms.
		DecodePerMTokens: 56 * time.Millisecond,
	}
}

// DefaultPreset is the preset used where none is named: an 8B model on
// one H100.
const DefaultPreset = "llama3-8b-h100"

// presets maps a preset name to its constructor.
func presets() map[string]func() Config {
	return map[string]func() Config{
		DefaultPreset:       llama8B,
		"llama3-70b-8xh100": llama70B,
		"qwen3-32b-2xh100":  qwen32B,
	}
}

// Preset returns the named preset's Config. Names are listed by Presets;
// a name ending in .yaml or .yml is a preset file's path (LoadPreset).
func Preset(name string) (Config, error) {
	if IsPresetFile(name) {
		return LoadPreset(name)
	}
	f, ok := presets()[name]
	if !ok {
		return Config{}, fmt.Errorf("engine preset %q: unknown (have %v)", name, Presets())
	}
	return f(), nil
}

// Presets returns the preset names, sorted.
func Presets() []string {
	var names []string
	for n := range presets() {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

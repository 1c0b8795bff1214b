package engine

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// A preset file is a user's own preset: a YAML document of an engine's
// shape and rates, such as `kvrouter calibrate` writes for a live engine.
// Every key is optional; a key left out takes its value from the preset
// named by base (DefaultPreset without one). Durations are Go durations
// ("46us", "6.8ms").
//
//	base: llama3-8b-h100       # the preset the file starts from
//	engine: vllm               # or llamacpp: slots that keep their last prompt
//	block-size: 16             # tokens per KV block
//	kv-blocks: 28160           # KV capacity, in blocks
//	max-num-seqs: 256          # the running batch's cap
//	max-batched-tokens: 8192   # the tokens of one step
//	max-model-len: 131072      # prompt plus output, per request
//	kv-bytes-per-token: 131072 # KV bytes of one token
//	interconnect-gbps: 50      # KV transfer bandwidth, GB/s each way
//	step-overhead: 1.5ms       # every step's fixed cost
//	prefill-per-token: 46us    # a prompt token's linear cost
//	attn-per-mpairs: 1.5ms     # attention, per million (token, context) pairs
//	decode-step: 6.8ms         # a step that decodes (the weights' read)
//	decode-per-seq: 60us       # per decoding sequence
//	decode-per-mtokens: 56ms   # per million tokens of decoding context
//	slot-similarity: 0.1       # llamacpp: --slot-prompt-similarity
//	host-cache-tokens: 8388608 # llamacpp: the host prompt cache (--cache-ram), tokens
//
// A llamacpp engine runs max-num-seqs slots (-np) sharing kv-blocks ×
// block-size tokens of context (-c); its block size is only the
// granularity at which prompts are compared.
// Preset reads such a file for a name ending in .yaml or .yml.

// PresetFile is a preset file's content (see the notes above); a nil
// field is left out.
type PresetFile struct {
	Base             string   `yaml:"base,omitempty"`
	Engine           string   `yaml:"engine,omitempty"`
	BlockSize        *int     `yaml:"block-size,omitempty"`
	KVBlocks         *int     `yaml:"kv-blocks,omitempty"`
	MaxNumSeqs       *int     `yaml:"max-num-seqs,omitempty"`
	MaxBatchedTokens *int     `yaml:"max-batched-tokens,omitempty"`
	MaxModelLen      *int     `yaml:"max-model-len,omitempty"`
	KVBytesPerToken  *int     `yaml:"kv-bytes-per-token,omitempty"`
	InterconnectGBps *float64 `yaml:"interconnect-gbps,omitempty"`
	StepOverhead     *string  `yaml:"step-overhead,omitempty"`
	PrefillPerToken  *string  `yaml:"prefill-per-token,omitempty"`
	AttnPerMPairs    *string  `yaml:"attn-per-mpairs,omitempty"`
	DecodeStep       *string  `yaml:"decode-step,omitempty"`
	DecodePerSeq     *string  `yaml:"decode-per-seq,omitempty"`
	DecodePerMTokens *string  `yaml:"decode-per-mtokens,omitempty"`
	SlotSimilarity   *float64 `yaml:"slot-similarity,omitempty"`
	HostCacheTokens  *int     `yaml:"host-cache-tokens,omitempty"`
}

// maxPresetFileBytes bounds a preset file.
const maxPresetFileBytes = 1 << 20

// IsPresetFile reports whether a preset name is a file's path: it ends in
// .yaml or .yml.
func IsPresetFile(name string) bool {
	return strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")
}

// LoadPreset reads the preset file at path.
func LoadPreset(path string) (Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return Config{}, fmt.Errorf("preset file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxPresetFileBytes+1))
	if err != nil {
		return Config{}, fmt.Errorf("preset file %s: %w", path, err)
	}
	if len(data) > maxPresetFileBytes {
		return Config{}, fmt.Errorf("preset file %s: larger than %d bytes", path, maxPresetFileBytes)
	}
	c, err := ParsePreset(data)
	if err != nil {
		return Config{}, fmt.Errorf("preset file %s: %w", path, err)
	}
	return c, nil
}

// ParsePreset reads a preset file's content into the Config it describes,
// validated. Unknown keys are errors.
func ParsePreset(data []byte) (Config, error) {
	var pf PresetFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&pf); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, err
	}
	return pf.Config()
}

// Config is the preset the file describes: its base with the file's
// values, validated.
func (pf *PresetFile) Config() (Config, error) {
	base := pf.Base
	if base == "" {
		base = DefaultPreset
	}
	if IsPresetFile(base) {
		return Config{}, fmt.Errorf("base %q: want a built-in preset (%v)", base, Presets())
	}
	c, err := Preset(base)
	if err != nil {
		return Config{}, err
	}
	ints := []struct {
		key string
		v   *int
		dst *int
	}{
		{"block-size", pf.BlockSize, &c.BlockSize}, {"kv-blocks", pf.KVBlocks, &c.NumBlocks}, {"max-num-seqs", pf.MaxNumSeqs, &c.MaxNumSeqs},
		{"max-batched-tokens", pf.MaxBatchedTokens, &c.MaxBatchedTokens}, {"max-model-len", pf.MaxModelLen, &c.MaxModelLen},
		{"kv-bytes-per-token", pf.KVBytesPerToken, &c.KVBytesPerToken}, {"host-cache-tokens", pf.HostCacheTokens, &c.HostCacheTokens},
	}
	for _, f := range ints {
		if f.v == nil {
			continue
		}
		if *f.v < 1 {
			return Config{}, fmt.Errorf("%s: %d, want a positive count", f.key, *f.v)
		}
		*f.dst = *f.v
	}
	if pf.BlockSize != nil && pf.KVBlocks == nil {
		return Config{}, errors.New("block-size without kv-blocks: say the capacity in blocks of that size")
	}
	if pf.InterconnectGBps != nil {
		c.InterconnectGBps = *pf.InterconnectGBps
	}
	if pf.Engine != "" {
		c.Kind = pf.Engine
	}
	if pf.SlotSimilarity != nil {
		c.SlotSimilarity = *pf.SlotSimilarity
	}
	durs := []struct {
		key string
		v   *string
		dst *time.Duration
	}{
		{"step-overhead", pf.StepOverhead, &c.StepOverhead}, {"prefill-per-token", pf.PrefillPerToken, &c.PrefillPerToken},
		{"attn-per-mpairs", pf.AttnPerMPairs, &c.AttnPerMPairs}, {"decode-step", pf.DecodeStep, &c.DecodeStep},
		{"decode-per-seq", pf.DecodePerSeq, &c.DecodePerSeq}, {"decode-per-mtokens", pf.DecodePerMTokens, &c.DecodePerMTokens},
	}
	for _, f := range durs {
		if f.v == nil {
			continue
		}
		d, err := time.ParseDuration(*f.v)
		if err != nil || d < 0 {
			return Config{}, fmt.Errorf("%s: %q, want a duration >= 0", f.key, *f.v)
		}
		*f.dst = d
	}
	if err := c.defaults().validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// PresetFileOf is the preset file of c: every figure, from base.
func PresetFileOf(base string, c Config) PresetFile {
	c = c.defaults()
	ip := func(v int) *int { return &v }
	dp := func(d time.Duration) *string { s := d.String(); return &s }
	gbps := c.InterconnectGBps
	var sim *float64
	var host *int
	if c.Kind == KindLlamaCpp {
		sim, host = &c.SlotSimilarity, ip(c.HostCacheTokens)
	}
	return PresetFile{
		Base: base, BlockSize: ip(c.BlockSize), KVBlocks: ip(c.NumBlocks), MaxNumSeqs: ip(c.MaxNumSeqs),
		MaxBatchedTokens: ip(c.MaxBatchedTokens), MaxModelLen: ip(c.MaxModelLen), KVBytesPerToken: ip(c.KVBytesPerToken),
		InterconnectGBps: &gbps, StepOverhead: dp(c.StepOverhead), PrefillPerToken: dp(c.PrefillPerToken),
		AttnPerMPairs: dp(c.AttnPerMPairs), DecodeStep: dp(c.DecodeStep), DecodePerSeq: dp(c.DecodePerSeq),
		DecodePerMTokens: dp(c.DecodePerMTokens), Engine: c.Kind, SlotSimilarity: sim, HostCacheTokens: host,
	}
}

package prefix

import (
	"crypto/sha256"
	"fmt"

	"github.com/fxamacker/cbor/v2"
)

// VLLM computes vLLM's block hashes with --prefix-caching-hash-algo
// sha256_cbor, so that a router's view can be cross-checked against a real
// vLLM's KV events (vllm/v1/core/kv_cache_utils.py: init_none_hash,
// hash_block_tokens, generate_block_hash_extra_keys; vllm/utils/hashing.py:
// sha256_cbor).
//
// Block i's hash is SHA-256 of the canonical CBOR of the triple
// (parent hash, block token ids, extra keys or None); block 0's parent is
// NONE_HASH = sha256_cbor(PYTHONHASHSEED as a string). The extra keys are
// the LoRA name, then the cache_salt (first block only).
type VLLM struct {
	// Seed is the engine's PYTHONHASHSEED. vLLM draws a random NONE_HASH
	// when it is unset; hashes are then not reproducible by anyone.
	Seed string
	// BlockSize is tokens per block; zero means 16.
	BlockSize int
	// LoRA is the adapter name (empty for the base model).
	LoRA string
	// CacheSalt is the request's cache_salt (empty for none).
	CacheSalt string
}

var canonical = func() cbor.EncMode {
	m, err := cbor.CanonicalEncOptions().EncMode()
	if err != nil {
		panic(err) // constant options: a programmer error
	}
	return m
}()

func sha256CBOR(v any) ([32]byte, error) {
	b, err := canonical.Marshal(v)
	if err != nil {
		return [32]byte{}, err
	}
	return sha256.Sum256(b), nil
}

// NoneHash is the parent of the first block.
func (v VLLM) NoneHash() ([32]byte, error) { return sha256CBOR(v.Seed) }

// Blocks returns the 32-byte hashes of tokens' full blocks.
func (v VLLM) Blocks(tokens []uint32) ([][32]byte, error) {
	bs := v.BlockSize
	if bs <= 0 {
		bs = 16
	}
	parent, err := v.NoneHash()
	if err != nil {
		return nil, fmt.Errorf("vllm none hash: %w", err)
	}
	var out [][32]byte
	for i := 0; i+bs <= len(tokens); i += bs {
		var extra []any
		if v.LoRA != "" {
			extra = append(extra, v.LoRA)
		}
		if v.CacheSalt != "" && i == 0 {
			extra = append(extra, v.CacheSalt)
		}
		var extraKeys any // None
		if extra != nil {
			extraKeys = extra
		}
		h, err := sha256CBOR([]any{parent[:], tokens[i : i+bs], extraKeys})
		if err != nil {
			return nil, fmt.Errorf("vllm block %d: %w", i/bs, err)
		}
		out = append(out, h)
		parent = h
	}
	return out, nil
}

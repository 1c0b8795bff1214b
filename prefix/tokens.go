package prefix

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// Root is the hash every chain starts from: it folds in the model and the
// LoRA adapter name (empty for the base model), so that different models and
// adapters never share a block hash.
func Root(model, lora string) Hash {
	var d xxhash.Digest
	d.Reset()
	d.WriteString("github.com/kvrouter/kvrouter/v1\x00")
	d.WriteString(model)
	d.WriteString("\x00")
	d.WriteString(lora)
	return Hash(d.Sum64())
}

// Chain returns the hash of a block whose parent is parent and whose content
// is b.
func Chain(parent Hash, b []byte) Hash {
	var d xxhash.Digest
	d.Reset()
	var p [8]byte
	binary.LittleEndian.PutUint64(p[:], uint64(parent))
	d.Write(p[:])
	d.Write(b)
	return Hash(d.Sum64())
}

// ChainTokens returns the hash of a block of token ids whose parent is parent.
// It does not allocate.
func ChainTokens(parent Hash, tokens []uint32) Hash {
	var d xxhash.Digest
	d.Reset()
	var buf [8 * 64]byte
	binary.LittleEndian.PutUint64(buf[:8], uint64(parent))
	n := 8
	for _, t := range tokens {
		if n+4 > len(buf) {
			d.Write(buf[:n])
			n = 0
		}
		binary.LittleEndian.PutUint32(buf[n:], t)
		n += 4
	}
	d.Write(buf[:n])
	return Hash(d.Sum64())
}

// Blocks appends to out the chained hashes of the full blocks of tokens,
// blockSize tokens each, starting from root. A trailing partial block is not
// hashed (as in vLLM). It allocates only if out lacks capacity.
func Blocks(root Hash, tokens []uint32, blockSize int, out []Hash) []Hash {
	if blockSize <= 0 {
		blockSize = 16
	}
	h := root
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		h = ChainTokens(h, tokens[i:i+blockSize])
		out = append(out, h)
	}
	return out
}

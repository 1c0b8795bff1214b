package trace

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"

	"github.com/kvrouter/kvrouter/prefix"
)

// Root returns the root that EngineHashes chains from: the model "trace"
// with no LoRA adapter.
func Root() prefix.Hash { return prefix.Root("trace", "") }

// runBytes is the encoded size of one run (segment id, offset, length).
const runBytes = 16

// maxRuns is how many runs a block buffer holds before it is folded.
const maxRuns = 16

// EngineHashes appends to out the chained hashes of the prompt's full blocks
// of blockSize tokens (zero means 16), starting from Root(). It is
// Hashes(Root(), blockSize, out).
func (r *Request) EngineHashes(blockSize int, out []prefix.Hash) []prefix.Hash {
	return r.Hashes(Root(), blockSize, out)
}

// Hashes appends to out the chained hashes of the prompt's full blocks of
// blockSize tokens (zero means 16), starting from root; a trailing partial
// block is not hashed, as in vLLM.
//
// Tokens are never materialised: token k of segment s is the pair (s.ID, k),
// and a block is described by the runs of consecutive tokens of one segment
// it holds (id, first offset, length), so a block's hash depends only on its
// content and its parent. Requests that share leading segments therefore
// share leading hashes, also when a segment boundary falls mid-block. It
// allocates only if out lacks capacity.
func (r *Request) Hashes(root prefix.Hash, blockSize int, out []prefix.Hash) []prefix.Hash {
	if blockSize <= 0 {
		blockSize = 16
	}
	var buf [8 + runBytes*maxRuns]byte
	h := root
	n, fill := 8, 0 // bytes in buf (parent first), tokens in the block
	for _, s := range r.Segments {
		for off := 0; off < s.Tokens; {
			take := min(blockSize-fill, s.Tokens-off)
			if n+runBytes > len(buf) {
				// Fold the runs so far into one: still a pure function
				// of the block's runs.
				binary.LittleEndian.PutUint64(buf[8:], xxhash.Sum64(buf[8:n]))
				n = 16
			}
			binary.LittleEndian.PutUint64(buf[n:], s.ID)
			binary.LittleEndian.PutUint32(buf[n+8:], uint32(off))
			binary.LittleEndian.PutUint32(buf[n+12:], uint32(take))
			n += runBytes
			fill += take
			off += take
			if fill == blockSize {
				binary.LittleEndian.PutUint64(buf[:8], uint64(h))
				h = prefix.Hash(xxhash.Sum64(buf[:n]))
				out = append(out, h)
				n, fill = 8, 0
			}
		}
	}
	return out
}

// Blocks returns the number of full blocks of blockSize tokens (zero means
// 16) in the prompt: the length of its Hashes.
func (r *Request) Blocks(blockSize int) int {
	if blockSize <= 0 {
		blockSize = 16
	}
	return r.Prompt / blockSize
}

// PrefixKey returns a hash of the prompt's first tokens tokens (all of it if
// shorter), for consistent-hashing policies that key on the start of the
// prompt (route.Request.PrefixKey; 100 characters are about 25 tokens).
func (r *Request) PrefixKey(tokens int) uint64 {
	var d xxhash.Digest
	d.Reset()
	var b [runBytes]byte
	for _, s := range r.Segments {
		if tokens <= 0 {
			break
		}
		take := min(tokens, s.Tokens)
		binary.LittleEndian.PutUint64(b[:], s.ID)
		binary.LittleEndian.PutUint32(b[8:], 0)
		binary.LittleEndian.PutUint32(b[12:], uint32(take))
		d.Write(b[:])
		tokens -= take
	}
	return d.Sum64()
}

package proxy

import (
	"sync/atomic"
	"time"

	"kvrouter/prefix"
	"kvrouter/residency"
	"kvrouter/route"
)

// hasher turns a parsed request into the chained block hashes the
// residency index is keyed on, and an estimate of its prompt tokens. Text
// mode (prefix.Text) is the one implementation today; token mode (a real
// tokenizer and chat template, engine-aligned blocks) is a second one that
// slots in here without touching the call path.
type hasher interface {
	// Hashes appends p's block hashes to out and returns them with the
	// prompt's token estimate.
	Hashes(p *prefix.Prompt, out []prefix.Hash) ([]prefix.Hash, int)
	// TokensPerBlock is the tokens one block stands for (the snapshot's
	// BlockSize).
	TokensPerBlock() int
}

// newTextHasher returns the text-mode hasher with chunkChars-byte blocks.
func newTextHasher(chunkChars int) hasher { return prefix.Text{ChunkChars: chunkChars} }

// index is the router's residency index and how it is fed. In approximate
// mode (the only feed today) the router touches the chosen replica's
// blocks at routing time, and each replica's share is an LRU of its cache
// capacity in hasher blocks: the engine's reported NumBlocks×BlockSize
// tokens when its metrics say, else the configured fallback; a policy's
// Needs.IndexBlocks, when set, fixes it instead (the peer's own index
// size). A precise feed (KV events) writes the same residency.Index with
// Store/Remove/Clear, and Match is unchanged.
//
// Index time is the monotonic time since the router started.
type index struct {
	h     hasher
	x     *residency.Index // nil when the policy reads no index
	start time.Time
	// fixed is Needs.IndexBlocks: a capacity the engines' reports do not
	// change; zero means follow them.
	fixed int
	// caps is each replica's current capacity in blocks, to call
	// SetCapacity only on a change.
	caps []atomic.Int64
}

// newIndex builds the index for a policy with needs over n replicas, each
// starting with fallback blocks.
func newIndex(h hasher, needs route.Needs, n, fallback int) *index {
	ix := &index{h: h, start: time.Now(), fixed: needs.IndexBlocks, caps: make([]atomic.Int64, n)}
	if needs.Index == route.NoIndex {
		return ix
	}
	capacity := fallback
	if ix.fixed > 0 {
		capacity = ix.fixed
	}
	ix.x = residency.New(residency.Config{MaxReplicas: max(n, 1), DefaultCapacity: capacity, TTL: needs.IndexTTL})
	for i := range n {
		ix.x.AddReplica(i, capacity) // i < MaxReplicas: no error
		ix.caps[i].Store(int64(capacity))
	}
	return ix
}

// mode names the index feed for decision records.
func (ix *index) mode() string {
	if ix.x == nil {
		return "none"
	}
	return "approximate"
}

// now is index time.
func (ix *index) now(t time.Time) time.Duration { return t.Sub(ix.start) }

// hash returns p's block hashes (appended to out) and token estimate.
func (ix *index) hash(p *prefix.Prompt, out []prefix.Hash) ([]prefix.Hash, int) {
	return ix.h.Hashes(p, out)
}

// match fills match and age per replica for hashes at now. Without an
// index it leaves them zero.
func (ix *index) match(hashes []prefix.Hash, now time.Time, match []int, age []time.Duration) {
	if ix.x == nil {
		clear(match)
		clear(age)
		return
	}
	ix.x.Match(hashes, ix.now(now), match, age)
}

// touch records, in approximate mode, that replica i was sent hashes.
func (ix *index) touch(i int, hashes []prefix.Hash, now time.Time) {
	if ix.x != nil {
		ix.x.Touch(i, hashes, ix.now(now))
	}
}

// setEngineCapacity sizes replica i's share from its engine's reported
// KV geometry (numBlocks of blockSize tokens); zeros are ignored.
func (ix *index) setEngineCapacity(i, numBlocks, blockSize int) {
	if ix.x == nil || ix.fixed > 0 || numBlocks <= 0 || blockSize <= 0 {
		return
	}
	blocks := int64(numBlocks * blockSize / ix.h.TokensPerBlock())
	if blocks > 0 && ix.caps[i].Swap(blocks) != blocks {
		ix.x.SetCapacity(i, int(blocks))
	}
}

// fillBlocks writes each replica's IndexBlocks into s.
func (ix *index) fillBlocks(s *route.Snapshot) {
	if ix.x == nil {
		return
	}
	for i := range s.Replicas {
		s.Replicas[i].IndexBlocks = ix.x.Blocks(i)
	}
}

// blocks returns the blocks the index attributes to replica i, and its
// capacity there.
func (ix *index) blocks(i int) (held, capacity int) {
	if ix.x == nil {
		return 0, 0
	}
	return ix.x.Blocks(i), int(ix.caps[i].Load())
}

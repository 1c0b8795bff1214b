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

// index is the router's residency index and how it is fed.
//
// Approximate tracking (x): the router touches the chosen replica's blocks
// at routing time, and each replica's share is an LRU of its cache
// capacity in hasher blocks: the engine's reported NumBlocks×BlockSize
// tokens when its metrics say, else the configured fallback; a policy's
// Needs.IndexBlocks, when set, fixes it instead (the peer's own index
// size).
//
// Precise mode (px, see precise.go) adds the engines' KV events: px is
// written only by the kvevents Subscriber, and a replica whose event
// stream is healthy is matched against px merged with the short-lived
// "just routed" overlay; a replica whose stream is missing or stale falls
// back to x, which the router keeps touching for every replica so that the
// fallback starts warm.
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
	// p is the precise side; nil in approximate mode.
	p *precise
}

// matchScratch holds a call's per-replica scratch for the precise match.
type matchScratch struct {
	pm, om []int
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

// Index feeds, as decision records and views name them.
const (
	IndexNone        = "none"
	IndexApproximate = "approximate"
	IndexPrecise     = "precise"
)

// mode names the index feed: precise when KV events are followed (some
// replicas may be falling back), else approximate or none.
func (ix *index) mode() string {
	switch {
	case ix.x == nil:
		return IndexNone
	case ix.p != nil:
		return IndexPrecise
	}
	return IndexApproximate
}

// modeOf names the feed replica i is matched against now.
func (ix *index) modeOf(i int) string {
	switch {
	case ix.x == nil:
		return IndexNone
	case ix.p != nil && ix.p.live[i].Load():
		return IndexPrecise
	}
	return IndexApproximate
}

// now is index time.
func (ix *index) now(t time.Time) time.Duration { return t.Sub(ix.start) }

// hash returns p's block hashes (appended to out) and token estimate.
func (ix *index) hash(p *prefix.Prompt, out []prefix.Hash) ([]prefix.Hash, int) {
	return ix.h.Hashes(p, out)
}

// match fills match and age per replica for hashes at now: from the
// precise index merged with the overlay for replicas whose event stream
// is healthy, from the approximate index for the others. Without an index
// it leaves them zero.
func (ix *index) match(hashes []prefix.Hash, now time.Time, sc *matchScratch, match []int, age []time.Duration) {
	if ix.x == nil {
		clear(match)
		clear(age)
		return
	}
	t := ix.now(now)
	ix.x.Match(hashes, t, match, age)
	if ix.p != nil {
		ix.p.match(hashes, t, sc, match, age)
	}
}

// touch records that replica i was sent hashes: in the approximate index
// always, and in precise mode in the overlay, telling the Subscriber to
// expect events when the precise index lacked a block of them (sc holds
// this request's precise match).
func (ix *index) touch(i int, hashes []prefix.Hash, now time.Time, sc *matchScratch) {
	if ix.x == nil {
		return
	}
	t := ix.now(now)
	ix.x.Touch(i, hashes, t)
	if ix.p != nil {
		ix.p.touch(i, hashes, t, sc)
	}
}

// setEngineCapacity sizes replica i's share from its engine's reported
// KV geometry (numBlocks of blockSize tokens); zeros are ignored.
func (ix *index) setEngineCapacity(i, numBlocks, blockSize int) {
	if ix.x == nil || numBlocks <= 0 || blockSize <= 0 {
		return
	}
	if ix.p != nil {
		ix.p.setCapacity(i, numBlocks)
	}
	if ix.fixed > 0 {
		return
	}
	blocks := int64(numBlocks * blockSize / ix.h.TokensPerBlock())
	if blocks > 0 && ix.caps[i].Swap(blocks) != blocks {
		ix.x.SetCapacity(i, int(blocks))
	}
}

// fillBlocks writes each replica's IndexBlocks into s: the precise
// index's count for replicas matched against it.
func (ix *index) fillBlocks(s *route.Snapshot) {
	if ix.x == nil {
		return
	}
	rs := s.Replicas
	ix.x.EachBlocks(len(rs), func(r, n int) { rs[r].IndexBlocks = n })
	if ix.p != nil {
		ix.p.x.EachBlocks(len(rs), func(r, n int) {
			if ix.p.live[r].Load() {
				rs[r].IndexBlocks = n
			}
		})
	}
}

// blocks returns the blocks the index attributes to replica i, and its
// capacity there, from the feed replica i is matched against.
func (ix *index) blocks(i int) (held, capacity int) {
	if ix.x == nil {
		return 0, 0
	}
	if ix.p != nil && ix.p.live[i].Load() {
		return ix.p.x.Blocks(i), int(ix.p.caps[i].Load())
	}
	return ix.x.Blocks(i), int(ix.caps[i].Load())
}

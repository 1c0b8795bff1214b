package residency

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
)

// DefaultOverlayTTL is how long a routing decision's blocks count as
// resident on the chosen replica in precise mode when
// TrackerConfig.OverlayTTL is zero: the moments between the decision and
// the engine's BlockStored events (the engine stores a prompt's blocks as
// its prefill completes, which under queueing takes seconds).
const DefaultOverlayTTL = 3 * time.Second

// Chain is a request's leading blocks at one block size.
type Chain struct {
	// Tokens is the prompt tokens one block stands for: the engine's block
	// size in token mode, an estimate in text mode.
	Tokens int
	// Hashes are the chained block hashes, block 0 first.
	Hashes []prefix.Hash
}

// Feed is a source of engine events for the precise index (package
// kvevents' Subscriber is one): it writes the index it was given and tells
// the tracker whose stream can be trusted. A second source implements these
// two methods and writes the same index; nothing else changes.
type Feed interface {
	// Healthy reports whether replica r's stream can be trusted now.
	Healthy(r int) bool
	// Expect tells the feed that replica r was sent blocks it did not hold,
	// so that events are due: a stream silent after that turns stale.
	Expect(r int)
}

// TrackerConfig describes what a Tracker keeps.
type TrackerConfig struct {
	// MaxReplicas bounds replica ids (see Config.MaxReplicas).
	MaxReplicas int
	// Approximate keeps the index fed by routing decisions (Touch).
	// Precise keeps, besides it, an index fed by engine events (Precise)
	// and a just-routed overlay; replicas whose feed is unhealthy fall
	// back to the approximate one, which is touched all along so that the
	// fallback starts warm. Neither: the tracker holds nothing and matches
	// nothing.
	Approximate, Precise bool
	// Blocks fixes each replica's share of the approximate index, in index
	// blocks (a peer router's own index size); zero means each replica's
	// cache capacity (SetCapacity).
	Blocks int
	// TTL drops approximate entries untouched for longer; zero means never.
	TTL time.Duration
	// CoarseTokens merges the chain's blocks into index blocks of this many
	// tokens in the approximate index (a peer's own granularity, e.g.
	// llm-d's 64): the hash of every k-th block, k = CoarseTokens /
	// Chain.Tokens, names its index block. Zero or less than the chain's
	// block means no merging.
	CoarseTokens int
	// Engine says the chains are engine-aligned (token mode): replica r is
	// matched and touched with the chain whose Tokens is its engine block
	// size (SetBlockSize), and with none before that is known. False (text
	// mode): every replica uses the first chain.
	Engine bool
	// TextTokens is the tokens one text-mode block stands for, to size the
	// approximate shares from the engines' capacity; zero means 16.
	TextTokens int
	// OverlayTTL is the just-routed overlay's life; zero means
	// DefaultOverlayTTL.
	OverlayTTL time.Duration
	// DefaultCapacity is a replica's capacity in engine blocks until
	// SetCapacity reports one; zero means 65,536 blocks.
	DefaultCapacity int
}

// Tracker is what the router believes each replica caches: an approximate
// index fed by its own routing decisions and, in precise mode, an index fed
// by the engines' KV events merged with a short-lived overlay of what was
// just routed. The live router and the simulator use it the same way.
// Replica r is the r-th replica of the fleet. Times are index time, a
// duration since the fleet's start. It is safe for concurrent use.
type Tracker struct {
	cfg     TrackerConfig
	approx  *Index // nil when neither kind is kept
	precise *Index // nil in approximate mode
	overlay *Index // nil in approximate mode
	// offload is the precise index of the blocks engines hold off the GPU
	// only (their CPU tier, from KV events with another medium); nil in
	// approximate mode.
	offload *Index
	feed    Feed // nil: every precise stream is trusted

	// Per replica: the engine's tokens per block (0 unknown), whether its
	// precise stream is trusted (live), the approximate share's capacity
	// in index blocks and the precise one's in engine blocks.
	bs      []atomic.Int64
	live    []atomic.Bool
	caps    []atomic.Int64
	pcaps   []atomic.Int64
	replica atomic.Int64 // replicas added
	// sizes is the distinct known block sizes, smallest first, rebuilt
	// when a replica's changes (sizesMu serialises the rebuilds).
	sizes   atomic.Pointer[[]int]
	sizesMu sync.Mutex
}

// NewTracker returns an empty tracker.
func NewTracker(cfg TrackerConfig) *Tracker {
	if cfg.MaxReplicas <= 0 {
		cfg.MaxReplicas = 1024
	}
	cfg.MaxReplicas = min(cfg.MaxReplicas, MaxReplicasLimit)
	if cfg.OverlayTTL <= 0 {
		cfg.OverlayTTL = DefaultOverlayTTL
	}
	if cfg.DefaultCapacity <= 0 {
		cfg.DefaultCapacity = 1 << 16
	}
	if cfg.TextTokens <= 0 {
		cfg.TextTokens = 16
	}
	n := cfg.MaxReplicas
	t := &Tracker{cfg: cfg, bs: make([]atomic.Int64, n), live: make([]atomic.Bool, n),
		caps: make([]atomic.Int64, n), pcaps: make([]atomic.Int64, n)}
	if !cfg.Approximate && !cfg.Precise {
		return t
	}
	t.approx = New(Config{MaxReplicas: n, DefaultCapacity: cfg.DefaultCapacity, TTL: cfg.TTL})
	if cfg.Precise {
		t.precise = New(Config{MaxReplicas: n, DefaultCapacity: cfg.DefaultCapacity})
		t.overlay = New(Config{MaxReplicas: n, TTL: cfg.OverlayTTL})
		t.offload = New(Config{MaxReplicas: n, DefaultCapacity: cfg.DefaultCapacity})
	}
	return t
}

// SetFeed sets the precise index's feed; nil (the default) trusts every
// stream. With a feed every replica starts approximate until Poll finds
// its stream healthy. Call it before the tracker is used.
func (t *Tracker) SetFeed(f Feed) {
	t.feed = f
	for r := range t.live {
		t.live[r].Store(f == nil)
	}
}

// Kept reports whether the tracker keeps any index.
func (t *Tracker) Kept() bool { return t.approx != nil }

// Precise returns the index engine events write (Store, Remove, Clear), or
// nil in approximate mode.
func (t *Tracker) Precise() *Index { return t.precise }

// Offloaded returns the index engine events write the blocks held off the
// GPU to (a CPU tier), nil in approximate mode.
func (t *Tracker) Offloaded() *Index { return t.offload }

// AddReplica starts tracking replica r with the default capacity.
func (t *Tracker) AddReplica(r int) {
	if r < 0 || r >= t.cfg.MaxReplicas {
		return
	}
	t.replica.Store(max(t.replica.Load(), int64(r+1)))
	t.live[r].Store(t.feed == nil)
	if t.approx == nil {
		return
	}
	c := t.cfg.DefaultCapacity
	if t.cfg.Blocks > 0 {
		c = t.cfg.Blocks
	}
	t.caps[r].Store(int64(c))
	t.approx.AddReplica(r, c)
	if t.precise != nil {
		t.pcaps[r].Store(int64(t.cfg.DefaultCapacity))
		t.precise.AddReplica(r, t.cfg.DefaultCapacity)
		t.overlay.AddReplica(r, 0)
	}
}

// SetBlockSize records replica r's engine tokens per block.
func (t *Tracker) SetBlockSize(r, tokens int) {
	if r >= 0 && r < len(t.bs) && tokens > 0 && t.bs[r].Swap(int64(tokens)) != int64(tokens) {
		t.rebuildSizes()
	}
}

// rebuildSizes recomputes the distinct block sizes of the replicas.
func (t *Tracker) rebuildSizes() {
	t.sizesMu.Lock()
	defer t.sizesMu.Unlock()
	var sizes []int
	for r := range int(t.replica.Load()) {
		if bs := int(t.bs[r].Load()); bs > 0 && !slices.Contains(sizes, bs) {
			sizes = append(sizes, bs)
		}
	}
	slices.Sort(sizes)
	t.sizes.Store(&sizes)
}

// BlockSizes returns the distinct engine block sizes known among the
// replicas, smallest first: the chains a token-mode request is hashed
// at. The slice is shared: do not modify it.
func (t *Tracker) BlockSizes() []int {
	if p := t.sizes.Load(); p != nil {
		return *p
	}
	return nil
}

// BlockSize returns replica r's engine tokens per block; zero if unknown.
func (t *Tracker) BlockSize(r int) int {
	if r < 0 || r >= len(t.bs) {
		return 0
	}
	return int(t.bs[r].Load())
}

// SetCapacity sizes replica r's shares from its engine's KV geometry:
// numBlocks blocks of its block size on the GPU, and cpuBlocks in its CPU
// tier (zero: none). The approximate share follows what the engine can
// serve a prefix from without computing it (unless TrackerConfig.Blocks
// fixes it), converted into index blocks: the GPU's blocks, or the CPU
// tier's when larger (an offloading engine copies every computed block
// there, so the tier holds nearly all the GPU does and what it evicted
// since). The precise share (GPU blocks only: the tier's have their own
// index) is only ever raised to numBlocks (the events are the truth, and a
// capacity below the engine's would evict blocks the engine holds).
func (t *Tracker) SetCapacity(r, numBlocks, cpuBlocks, blockTokens int) {
	if t.approx == nil || r < 0 || r >= len(t.caps) || numBlocks <= 0 || blockTokens <= 0 {
		return
	}
	if t.precise != nil && raise(&t.pcaps[r], int64(numBlocks)) {
		t.precise.SetCapacity(r, numBlocks)
	}
	if t.cfg.Blocks > 0 {
		return
	}
	it := t.indexTokens(r)
	if it <= 0 {
		return
	}
	if c := int64(max(numBlocks, cpuBlocks) * blockTokens / it); c > 0 && t.caps[r].Swap(c) != c {
		t.approx.SetCapacity(r, int(c))
	}
}

// raise sets v to n if n is larger and reports whether it did.
func raise(v *atomic.Int64, n int64) bool {
	for {
		c := v.Load()
		if n <= c {
			return false
		}
		if v.CompareAndSwap(c, n) {
			return true
		}
	}
}

// indexTokens is the tokens one approximate index block of replica r
// stands for; zero when unknown (token mode, block size not known yet).
func (t *Tracker) indexTokens(r int) int {
	if t.cfg.CoarseTokens > 0 {
		return t.cfg.CoarseTokens
	}
	if t.cfg.Engine {
		return t.BlockSize(r)
	}
	return t.cfg.TextTokens
}

// SetLive marks replica r's precise stream trusted or not; it reports
// whether that changed. Without a precise index it does nothing.
func (t *Tracker) SetLive(r int, live bool) bool {
	if t.precise == nil || r < 0 || r >= len(t.live) {
		return false
	}
	return t.live[r].Swap(live) != live
}

// Live reports whether replica r is matched against the precise index.
func (t *Tracker) Live(r int) bool {
	return t.precise != nil && r >= 0 && r < len(t.live) && t.live[r].Load()
}

// Poll reads the feed's health of every replica, marks each replica
// precise or approximate accordingly, and calls changed for every
// replica whose mode changed. Without a feed it does nothing.
func (t *Tracker) Poll(changed func(r int, live bool)) {
	if t.feed == nil || t.precise == nil {
		return
	}
	for r := range int(t.replica.Load()) {
		h := t.feed.Healthy(r)
		if t.SetLive(r, h) && changed != nil {
			changed(r, h)
		}
	}
}

// Clear forgets everything the tracker believes replica r holds (an engine
// restart): approximate, precise and overlay.
func (t *Tracker) Clear(r int) {
	for _, x := range []*Index{t.approx, t.precise, t.overlay, t.offload} {
		if x != nil {
			x.Clear(r)
		}
	}
}

package residency

import (
	"math"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
)

// An engine cannot evict a block a running request holds: vLLM's
// KVCacheManager keeps a reference count per block and only a block whose
// count fell to zero enters the free queue it allocates from, at the
// queue's tail, when the last request holding it finishes
// (vllm/v1/core/block_pool.py, free_blocks; kv_cache_utils.py,
// FreeKVCacheBlockQueue). So the age that says whether a cached block
// survives is the time since it was last released, not since a request
// was routed with it: under load a request holds its prompt for its whole
// time in the engine (a thousand tokens of output at 80 ms each is 80 s),
// which is as long as an eviction horizon. The approximate index follows
// that when its caller says when requests run: Hold when one starts
// holding its blocks, Release when it ends. A held block reads as touched
// now (Match's age ≤ 0); the blocks of a chain are released together.

// heldStamp is the touched stamp of a held entry: later than any index
// time, so that its age reads as at most zero, it never expires (TTL), and
// its hot holder set's oldest stamp stays a lower bound.
const heldStamp = time.Duration(math.MaxInt64)

// Hold records that a request whose chain is hashes holds its blocks on
// replica r from now until Release: as Touch, and every block then reads
// as touched now until the last request holding it is released. A later
// Touch of a held block keeps it held.
func (x *Index) Hold(r int, hashes []prefix.Hash, now time.Duration) {
	x.store(r, hashes, now, true)
}

// Release records that a request Hold recorded on replica r has ended at
// now: each of its blocks r still has is held by one request fewer, and
// one no longer held is stamped now, block 0 the most recent, as the
// engine frees them. Blocks the index evicted meanwhile are not brought
// back (the engine's are not held past its capacity either: it admits a
// request only when its blocks fit).
func (x *Index) Release(r int, hashes []prefix.Hash, now time.Duration) {
	if !x.valid(r) || len(hashes) == 0 {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for i := len(hashes) - 1; i >= 0; i-- {
		nd, ok := x.getNode(hashes[i])
		if !ok {
			continue
		}
		e := x.holderLocked(nd, r)
		if e < 0 {
			continue
		}
		if n := x.heldCount(e); n > 1 {
			x.held[e] = n - 1
			continue
		} else if n == 1 {
			delete(x.held, e)
			x.entry(e).touched = now // no longer held: refreshLocked stamps it
		}
		x.refreshLocked(e, nd, now)
	}
}

// Hold records that a request with chains holds its blocks on replica r
// from now until Release: in its approximate share (which a replica whose
// precise stream is not trusted is matched against), their ages read
// zero meanwhile (Index.Hold). The just-routed overlay and the feed are
// Touch's.
func (t *Tracker) Hold(r int, chains []Chain, now time.Duration, sc *MatchScratch) {
	if hashes := t.approxHashes(chains, r, sc); hashes != nil {
		t.approx.Hold(r, hashes, now)
	}
}

// Release records that a request Hold recorded on replica r with chains
// ended at now: its blocks age from now on (Index.Release).
func (t *Tracker) Release(r int, chains []Chain, now time.Duration, sc *MatchScratch) {
	if hashes := t.approxHashes(chains, r, sc); hashes != nil {
		t.approx.Release(r, hashes, now)
	}
}

// approxHashes returns the approximate index's hashes of replica r's
// chain of chains, nil when it has none (or no index is kept).
func (t *Tracker) approxHashes(chains []Chain, r int, sc *MatchScratch) []prefix.Hash {
	c, ok := t.ChainFor(chains, r)
	if !ok {
		return nil
	}
	hashes, _ := t.coarsen(&c, sc)
	return hashes
}

// ChainFor returns the chain of chains replica r is matched and touched
// with (the first in text mode, the one of its engine block size in token
// mode), and false when it has none (or no index is kept).
func (t *Tracker) ChainFor(chains []Chain, r int) (Chain, bool) {
	ci := t.chainOf(chains, r)
	if t.approx == nil || ci < 0 || len(chains[ci].Hashes) == 0 {
		return Chain{}, false
	}
	return chains[ci], true
}

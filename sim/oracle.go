package sim

import (
	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/prefix"
)

// Oracles are the hit-rate ceilings a routing policy is judged against
// (docs/benchmarks.md), computed over the run's jobs in arrival order.
//
//   - Infinite cache: a set of every block hash seen so far. A request's
//     cached tokens are its leading blocks already in the set.
//   - Pooled cache: ONE cache holding the whole fleet's blocks
//     (Replicas × NumBlocks), with the engine's eviction policy (LRU of
//     blocks). The approximation: blocks are looked up and touched at
//     arrival, in arrival order, and are evictable at once; a real engine
//     pins the blocks of running requests until they finish and also holds
//     their output blocks. With a fleet-sized pool the difference is small
//     (the running set is a small part of the pool), and it errs on the
//     generous side, which is what a ceiling should do.
//
// Both apply the engine's last-token rule (cachedTokens): a prompt served
// wholly from cache still recomputes its last token, so at most
// (prompt-1)/blockSize blocks count as cached. Both count only what the
// engines can serve: a request the engine refuses for its length
// (engine.Config.CheckLength: longer than MaxModelLen or than one replica's
// cache) is left out, its prompt not counted and its blocks not cached, as
// the policies' hit rates leave it out (it never completes).

// oracleResult is one oracle's totals.
type oracleResult struct {
	Prompt, Cached int64
}

// rate is the hit rate, 0..1.
func (o oracleResult) rate() float64 {
	if o.Prompt == 0 {
		return 0
	}
	return float64(o.Cached) / float64(o.Prompt)
}

// cachedTokens is the engine's rule: matched leading blocks, capped so that
// at least one prompt token is computed (vLLM v1 looks up at most
// prompt-1 tokens), in whole blocks.
func cachedTokens(matched, prompt, blockSize int) int {
	if max := (prompt - 1) / blockSize; matched > max {
		matched = max
	}
	if matched < 0 {
		return 0
	}
	return matched * blockSize
}

// servable reports whether an engine of configuration c admits job j.
func servable(c *engine.Config, j *job) bool {
	return c.CheckLength(j.prompt, j.output) == nil
}

// infiniteOracle returns the infinite-cache totals of the jobs an engine of
// configuration c serves.
func infiniteOracle(jobs []job, c *engine.Config) oracleResult {
	var res oracleResult
	seen := newTable(1 << 16)
	for i := range jobs {
		j := &jobs[i]
		if !servable(c, j) {
			continue
		}
		// The set is prefix-closed (a request adds its whole chain), and a
		// chained hash names its whole prefix, so the seen blocks of a
		// request are a leading run: binary search for its length.
		lo, hi := 0, len(j.hashes) // hashes[:lo] seen, hashes[hi:] not
		for lo < hi {
			mid := int(uint(lo+hi) >> 1)
			if _, ok := seen.get(j.hashes[mid]); ok {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		res.Prompt += int64(j.prompt)
		res.Cached += int64(cachedTokens(lo, j.prompt, c.BlockSize))
		for _, h := range j.hashes[lo:] {
			seen.put(h, 0)
		}
	}
	return res
}

// pooledOracle returns the pooled-cache totals of the jobs an engine of
// configuration c serves: one engine holding the whole fleet's KV, an
// LRU of gpu blocks, and when cpu > 0 a CPU tier of cpu blocks beside it
// (engine/tier.go: every block stored is written through to it, and a
// prompt block found there is loaded, not computed, so it counts as
// cached as the engines count it).
func pooledOracle(jobs []job, c *engine.Config, gpu, cpu int) oracleResult {
	var res oracleResult
	l := newLRU(gpu)
	var host *lru
	if cpu > 0 {
		host = newLRU(cpu)
	}
	held := func(h prefix.Hash) bool { return l.has(h) || host != nil && host.has(h) }
	for i := range jobs {
		j := &jobs[i]
		if !servable(c, j) {
			continue
		}
		m := 0
		for m < len(j.hashes) && held(j.hashes[m]) {
			m++
		}
		res.Prompt += int64(j.prompt)
		res.Cached += int64(cachedTokens(m, j.prompt, c.BlockSize))
		// Touch leaf-last, so the root of the chain is the most recent:
		// like the engine, which frees a request's blocks in reverse order
		// so that the tail is evicted first.
		for k := len(j.hashes) - 1; k >= 0; k-- {
			l.touch(j.hashes[k])
			if host != nil {
				host.touch(j.hashes[k])
			}
		}
	}
	return res
}

// lru is a fixed-capacity LRU set of block hashes: a map to slots of an
// intrusive doubly linked list held in slices (no pointer per entry).
type lru struct {
	slot       table
	hash       []prefix.Hash
	prev, next []int32
	head       int32 // most recent, -1 when empty
	tail       int32 // least recent
	cap        int
}

func newLRU(capacity int) *lru {
	if capacity < 1 {
		capacity = 1
	}
	return &lru{slot: newTable(min(capacity, 1<<20)), head: -1, tail: -1, cap: capacity}
}

func (l *lru) has(h prefix.Hash) bool { _, ok := l.slot.get(h); return ok }

// touch makes h the most recent entry, inserting it (and evicting the least
// recent entry when full) if absent.
func (l *lru) touch(h prefix.Hash) {
	if s, ok := l.slot.get(h); ok {
		l.unlink(s)
		l.pushFront(s)
		return
	}
	var s int32
	if len(l.hash) < l.cap {
		s = int32(len(l.hash))
		l.hash = append(l.hash, h)
		l.prev = append(l.prev, -1)
		l.next = append(l.next, -1)
	} else {
		s = l.tail
		l.unlink(s)
		l.slot.del(l.hash[s])
		l.hash[s] = h
	}
	l.slot.put(h, s)
	l.pushFront(s)
}

func (l *lru) unlink(s int32) {
	p, n := l.prev[s], l.next[s]
	if p >= 0 {
		l.next[p] = n
	} else {
		l.head = n
	}
	if n >= 0 {
		l.prev[n] = p
	} else {
		l.tail = p
	}
}

func (l *lru) pushFront(s int32) {
	l.prev[s] = -1
	l.next[s] = l.head
	if l.head >= 0 {
		l.prev[l.head] = s
	}
	l.head = s
	if l.tail < 0 {
		l.tail = s
	}
}

package slots

import (
	"testing"

	"github.com/kvrouter/kvrouter/prefix"
)

// chainOf is a chain of n blocks whose first shared blocks are those of
// base (seed 0) and the rest its own.
func chainOf(seed uint64, shared, n int) []prefix.Hash {
	out := make([]prefix.Hash, n)
	for i := range out {
		s := seed
		if i < shared {
			s = 0
		}
		out[i] = prefix.Hash(s<<32 | uint64(i) + 1)
	}
	return out
}

// TestLCPSlotChoice: a prompt goes to the idle slot sharing most with it
// (above the similarity threshold) and reuses that prefix; a prompt that
// shares little takes the least recently used slot.
func TestLCPSlotChoice(t *testing.T) {
	var c Cache
	c.Resize(2)
	a, b := chainOf(1, 0, 40), chainOf(2, 0, 40)
	sa, _ := c.Start(a, 0)
	sb, _ := c.Start(b, 0)
	if sa == sb || sa < 0 || sb < 0 {
		t.Fatalf("two prompts on two idle slots took slots %d and %d", sa, sb)
	}
	if s, _ := c.Start(chainOf(3, 0, 4), 0); s != -1 {
		t.Fatalf("a third prompt on two busy slots took slot %d, want none", s)
	}
	c.Release(sa)
	c.Release(sb)
	next := append(chainOf(1, 0, 40), chainOf(3, 0, 10)...) // a's next turn
	if got := c.Predict(next); got != 40 {
		t.Errorf("next turn predicted to reuse %d blocks, want 40 (its slot's prompt)", got)
	}
	if s, reused := c.Start(next, 0); s != sa || reused != 40 {
		t.Errorf("next turn took slot %d reusing %d, want slot %d reusing 40 (longest common prefix)", s, reused, sa)
	}
	if got := c.Predict(chainOf(4, 2, 40)); got != 0 {
		t.Errorf("a prompt sharing 2 of 40 blocks (under the 0.1 similarity) predicted %d, want 0 (LRU slot)", got)
	}
}

// TestHostCache: a slot's prompt replaced by another is kept in the host
// prompt cache, and a later prompt that continues it is loaded from
// there, leaving the cache.
func TestHostCache(t *testing.T) {
	var c Cache
	c.Resize(1)
	a := chainOf(1, 0, 30)
	s, _ := c.Start(a, 0)
	c.Release(s)
	s, _ = c.Start(chainOf(2, 0, 30), 0) // LRU: a is saved first
	c.Release(s)
	next := append(chainOf(1, 0, 30), chainOf(5, 0, 5)...)
	if got := c.Predict(next); got != 30 {
		t.Errorf("a's next turn predicted %d blocks, want 30 (loaded from the host cache)", got)
	}
	if _, reused := c.Start(next, 0); reused != 30 {
		t.Errorf("a's next turn reused %d blocks, want 30", reused)
	}
	for _, p := range c.saved {
		if LCP(p.chain, a) == len(a) && len(p.chain) == len(a) {
			t.Error("the loaded prompt is still in the host cache")
		}
	}
}

// TestHostCacheLimit: over its bound in blocks the host cache drops its
// oldest prompts, and a prompt larger than the bound is not saved.
func TestHostCacheLimit(t *testing.T) {
	c := Cache{LimitBlocks: 50}
	c.Resize(1)
	for seed := range uint64(4) {
		s, _ := c.Start(chainOf(seed+1, 0, 20), 0)
		c.Release(s)
	}
	// Each start saved the idle slot's last prompt: 3 of 20 blocks, 2 fit.
	if n, blocks := c.Saved(); n != 2 || blocks != 40 {
		t.Errorf("host cache holds %d prompts of %d blocks, want 2 of 40", n, blocks)
	}
	s, _ := c.Start(chainOf(9, 0, 60), 0)
	c.Release(s)
	c.Start(chainOf(10, 0, 5), 0) // saves the idle slot's 60 blocks: too large
	if _, blocks := c.Saved(); blocks > 50 {
		t.Errorf("host cache holds %d blocks, over its bound of 50", blocks)
	}
}

package emulator

import (
	"fmt"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/prefix"
)

// Config.KVFullStatus: answering an error instead of queueing a request the
// KV cache has no room for, as llm-d-inference-sim does (its block cache
// fails a request whose new and reusable blocks exceed the blocks not in
// use, pkg/kv-cache/block_cache.go). vLLM never does this: its scheduler
// keeps the request waiting.
//
// The engine goroutine decides on arrival, before engine.Add, from the
// engine's own state (admissible). It learns which blocks are cached from
// the engine's BlockStored, BlockRemoved and AllCleared events, as a
// router would; a block evicted by the iteration in flight counts as
// cached until that iteration ends.

// kvFullError is Add's answer to a request the KV cache has no room for.
type kvFullError struct {
	need, free int // blocks
}

func (e *kvFullError) Error() string {
	return fmt.Sprintf("the KV cache has no room for this request: its prompt needs %d more blocks, %d are free or evictable", e.need, e.free)
}

// blockHashes are the chained hashes of the full blocks of tokens under
// adapter lora, as engine.Add computes them: from the engine's Root, with
// the adapter's name chained in first.
func (s *Server) blockHashes(tokens []uint32, lora string) []prefix.Hash {
	root := s.ecfg.Root
	if lora != "" {
		root = prefix.Chain(root, []byte(lora))
	}
	bs := s.ecfg.BlockSize
	return prefix.Blocks(root, tokens, bs, make([]prefix.Hash, 0, len(tokens)/bs))
}

// admissible reports a *kvFullError when Config.KVFullStatus is set and the
// KV cache has no room for r's prompt now: when the prompt's blocks that
// are not in the prefix cache outnumber the blocks no running request
// holds (free or evictable, TotalBlocks - UsedBlocks).
//
// The prompt's cached blocks are its leading full blocks found in the
// cache, at most (prompt-1)/BlockSize of them, as the engine never reuses
// the block holding the last prompt token. The rule counts the whole
// prompt, even one that chunked prefill would admit one chunk at a time,
// and not the blocks that requests still waiting will take. It is lenient
// by the cached blocks no request holds: they count as hits only, although
// the engine takes them off the free queue too.
func (l *loop) admissible(r *engine.Request) error {
	if l.cached == nil {
		return nil
	}
	bs := l.s.ecfg.BlockSize
	p := len(r.Tokens)
	limit := min(len(r.Hashes), (p-1)/bs)
	hits := 0
	for hits < limit {
		if _, ok := l.cached[r.Hashes[hits]]; !ok {
			break
		}
		hits++
	}
	st := l.s.eng.Stats()
	need, free := (p+bs-1)/bs-hits, st.TotalBlocks-st.UsedBlocks
	if need > free {
		return &kvFullError{need: need, free: free}
	}
	return nil
}

// track follows the engine's cached blocks through its block events, when
// Config.KVFullStatus is set.
func (l *loop) track(ev *engine.Event) {
	if l.cached == nil || ev.Medium != engine.GPU {
		return // only GPU blocks spare the GPU's free ones
	}
	switch ev.Kind {
	case engine.BlockStored:
		for _, h := range ev.Hashes {
			l.cached[h] = struct{}{}
		}
	case engine.BlockRemoved:
		for _, h := range ev.Hashes {
			delete(l.cached, h)
		}
	case engine.AllCleared:
		clear(l.cached)
	}
}

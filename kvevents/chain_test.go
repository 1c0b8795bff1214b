package kvevents

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
)

func newTestChain(model string) (*chain, *residency.Index) {
	idx := residency.New(residency.Config{MaxReplicas: 4})
	return newChain(1, model, idx, nil, func() time.Duration { return 0 }), idx
}

// keys returns the router keys of tokens cut in blocks of bs under model
// and lora: what a request tokenized by the router hashes to.
func keys(model, lora string, tokens []uint32, bs int) []prefix.Hash {
	return prefix.Blocks(prefix.Root(model, lora), tokens, bs, nil)
}

func sorted(h []prefix.Hash) []prefix.Hash {
	h = slices.Clone(h)
	slices.Sort(h)
	return h
}

func applyAll(t *testing.T, c *chain, payloads ...any) applied {
	t.Helper()
	var sum applied
	for _, p := range payloads {
		var b Batch
		if err := Decode(pack(t, p), &b); err != nil {
			t.Fatal(err)
		}
		n := c.apply(&b)
		sum.events += n.events
		sum.stored += n.stored
		sum.removed += n.removed
		sum.orphans += n.orphans
		sum.resets += n.resets
	}
	return sum
}

func TestChain(t *testing.T) {
	tok := utoks(1000, 16)
	all := keys("m", "", tok, 4)
	tests := []struct {
		name      string
		batches   []any
		want      []prefix.Hash // index, any order
		orphans   int
		resets    int
		blocksIn  int // engine blocks known
		offloaded int // of which held off GPU only
	}{
		{
			name:     "chained across events",
			batches:  []any{[]any{0.0, []any{[]any{"BlockStored", []any{1, 2}, nil, toks(1000, 8), 4}, []any{"BlockStored", []any{3, 4}, 2, toks(1008, 8), 4}}}},
			want:     all,
			blocksIn: 4,
		},
		{
			name: "removed by engine hash",
			batches: []any{
				[]any{0.0, []any{[]any{"BlockStored", []any{1, 2, 3, 4}, nil, toks(1000, 16), 4}}},
				[]any{0.0, []any{[]any{"BlockRemoved", []any{4, 3, 99}}}},
			},
			want:     all[:2],
			blocksIn: 2,
		},
		{
			name:     "unknown parent is an orphan",
			batches:  []any{[]any{0.0, []any{[]any{"BlockStored", []any{5, 6}, 77, toks(0, 8), 4}, []any{"BlockStored", []any{7}, 6, toks(8, 4), 4}}}},
			orphans:  3,
			blocksIn: 0,
		},
		{
			name: "cleared",
			batches: []any{
				[]any{0.0, []any{[]any{"BlockStored", []any{1, 2}, nil, toks(1000, 8), 4}}},
				[]any{0.0, []any{[]any{"AllBlocksCleared"}, []any{"BlockStored", []any{1}, nil, toks(1000, 4), 4}}},
			},
			want:     all[:1],
			resets:   1,
			blocksIn: 1,
		},
		{
			name: "offloaded to CPU: out of the index, counted",
			batches: []any{
				[]any{0.0, []any{[]any{"BlockStored", []any{1, 2}, nil, toks(1000, 8), 4, nil, "GPU"}}},
				[]any{0.0, []any{[]any{"BlockStored", []any{2}, 1, toks(1004, 4), 4, nil, "CPU"}}},
				[]any{0.0, []any{[]any{"BlockRemoved", []any{2}, "GPU"}}},
			},
			want:      all[:1],
			blocksIn:  2,
			offloaded: 1,
		},
		{
			name: "stored on CPU, chained onto, loaded back to GPU",
			batches: []any{
				[]any{0.0, []any{[]any{"BlockStored", []any{1}, nil, toks(1000, 4), 4, nil, "CPU"}}},
				[]any{0.0, []any{[]any{"BlockStored", []any{2}, 1, toks(1004, 4), 4, nil, "DISK"}}},
				[]any{0.0, []any{[]any{"BlockStored", []any{2}, 1, toks(1004, 4), 4, nil, "GPU"}}},
			},
			want:      all[1:2],
			blocksIn:  2,
			offloaded: 1,
		},
		{
			name: "off-GPU removals, then a clear",
			batches: []any{
				[]any{0.0, []any{[]any{"BlockStored", []any{1, 2}, nil, toks(1000, 8), 4, nil, "CPU"}}},
				[]any{0.0, []any{[]any{"BlockRemoved", []any{1}, "CPU"}, []any{"BlockRemoved", []any{2}, "GPU"}}},
				[]any{0.0, []any{[]any{"BlockStored", []any{3}, nil, toks(2000, 4), 4, nil, "DISK"}}},
				[]any{0.0, []any{[]any{"AllBlocksCleared"}, []any{"BlockStored", []any{4}, nil, toks(3000, 4), 4, nil, "CPU"}}},
			},
			resets:    1,
			blocksIn:  1,
			offloaded: 1,
		},
		{
			name: "a reused hash moves off GPU with its new content",
			batches: []any{
				[]any{0.0, []any{[]any{"BlockStored", []any{1}, nil, toks(1000, 4), 4, nil, "GPU"}}},
				[]any{0.0, []any{[]any{"BlockStored", []any{1}, nil, toks(1004, 4), 4, nil, "CPU"}}},
			},
			blocksIn:  1,
			offloaded: 1,
		},
		{
			name: "two engine hashes, one key: removed when both are",
			batches: []any{
				[]any{0.0, []any{[]any{"BlockStored", []any{1}, nil, toks(1000, 4), 4}, []any{"BlockStored", []any{9}, nil, toks(1000, 4), 4}}},
				[]any{0.0, []any{[]any{"BlockRemoved", []any{1}}}},
			},
			want:     all[:1],
			blocksIn: 1,
		},
		{
			name: "LoRA root",
			batches: []any{
				[]any{0.0, []any{omap{{"type", "BlockStored"}, {"block_hashes", []any{1}}, {"token_ids", toks(1000, 4)}, {"block_size", 4}, {"lora_name", "ad"}}}},
			},
			want:     keys("m", "ad", tok[:4], 4),
			blocksIn: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, idx := newTestChain("m")
			n := applyAll(t, c, tt.batches...)
			if d := cmp.Diff(sorted(tt.want), sorted(idx.Hashes(1)), cmpopts.EquateEmpty()); d != "" {
				t.Errorf("index (-want +got):\n%s", d)
			}
			if n.orphans != tt.orphans || n.resets != tt.resets || c.Len() != tt.blocksIn || c.offloaded != tt.offloaded {
				t.Errorf("orphans %d, resets %d, blocks %d, offloaded %d; want %d, %d, %d, %d",
					n.orphans, n.resets, c.Len(), c.offloaded, tt.orphans, tt.resets, tt.blocksIn, tt.offloaded)
			}
		})
	}
}

// TestChainBlockSize: the chain keeps the engine's tokens per block from
// its BlockStored events, group 0's for a hybrid model.
func TestChainBlockSize(t *testing.T) {
	st := func(group, bs int, hash uint64) omap {
		return omap{{"type", "BlockStored"}, {"block_hashes", []any{hash}}, {"token_ids", toks(0, bs)}, {"block_size", bs}, {"group_idx", group}}
	}
	tests := []struct {
		name    string
		batches []any
		want    int
	}{
		{"none yet", nil, 0},
		{"removals only", []any{[]any{0.0, []any{[]any{"BlockRemoved", []any{1}}, []any{"AllBlocksCleared"}}}}, 0},
		{"legacy array", []any{[]any{0.0, []any{[]any{"BlockStored", []any{1}, nil, toks(0, 16), 16}}}}, 16},
		{"from the tokens when the wire omits it", []any{[]any{0.0, []any{omap{{"type", "BlockStored"}, {"block_hashes", []any{1, 2}}, {"token_ids", toks(0, 64)}}}}}, 32},
		{"an orphan still tells it", []any{[]any{0.0, []any{[]any{"BlockStored", []any{2}, 99, toks(0, 8), 8}}}}, 8},
		{"kept across a clear", []any{[]any{0.0, []any{st(0, 4, 1), omap{{"type", "AllBlocksCleared"}}}}}, 4},
		{"the engine's latest", []any{[]any{0.0, []any{st(0, 4, 1)}}, []any{0.0, []any{st(0, 8, 2)}}}, 8},
		{"group 0 wins", []any{[]any{0.0, []any{st(1, 64, 1), st(0, 16, 2), st(1, 64, 3)}}}, 16},
		{"another group until group 0 stores", []any{[]any{0.0, []any{st(1, 64, 1)}}}, 64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := newTestChain("m")
			applyAll(t, c, tt.batches...)
			if c.blockSize != tt.want {
				t.Errorf("got %d, want %d", c.blockSize, tt.want)
			}
		})
	}
}

// TestChainMemoryBounded stores and removes many blocks: the engine-hash
// map shrinks back with the engine's cache.
func TestChainMemoryBounded(t *testing.T) {
	c, idx := newTestChain("m")
	for i := range 1000 {
		h := uint64(i + 1)
		applyAll(t, c, []any{0.0, []any{[]any{"BlockStored", []any{h}, nil, toks(i*4, 4), 4}}})
		if i >= 10 {
			applyAll(t, c, []any{0.0, []any{[]any{"BlockRemoved", []any{h - 10}}}})
		}
	}
	if c.Len() != 10 || idx.Blocks(1) != 10 || len(c.refs) != 10 {
		t.Errorf("blocks %d, index %d, refs %d; want 10 each", c.Len(), idx.Blocks(1), len(c.refs))
	}
}

// FuzzDecode: garbage never panics, and a payload that fails to decode
// never changes the index.
func FuzzDecode(f *testing.F) {
	seeds := []any{
		[]any{1.0, []any{[]any{"BlockStored", []any{1, 2}, nil, toks(0, 8), 4, nil, "GPU", nil}, []any{"BlockRemoved", []any{1}, "GPU"}, []any{"AllBlocksCleared"}}, 0},
		omap{{"ts", 1.0}, {"events", []any{omap{{"type", "BlockStored"}, {"block_hashes", []any{hash32(5)}}, {"parent_block_hash", 0}, {"token_ids", toks(0, 2)}, {"block_size", 2}, {"medium", "CPU"}, {"lora_name", "x"}}}}, {"attn_dp_rank", 1}},
	}
	for _, s := range seeds {
		f.Add(pack(f, s))
	}
	f.Add([]byte{0x93, 0xcb})
	f.Fuzz(func(t *testing.T, payload []byte) {
		c, idx := newTestChain("m")
		applyAll(t, c, []any{0.0, []any{[]any{"BlockStored", []any{1, 2}, nil, toks(0, 8), 4}, []any{"BlockStored", []any{3}, nil, toks(50, 4), 4, nil, "CPU"}}})
		before, offBefore := idx.Hashes(1), c.offloaded
		var b Batch
		if err := NewDecoder().Decode(payload, &b); err != nil {
			if !slices.Equal(before, idx.Hashes(1)) || c.offloaded != offBefore {
				t.Fatal("a failed decode changed the index")
			}
			return
		}
		c.apply(&b) // must not panic
	})
}

package emulator

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/prefix"
)

// storedEvent is a BlockStored event of n blocks with a parent.
func storedEvent(n int) []engine.Event {
	ev := engine.Event{Kind: engine.BlockStored, BlockSize: 16, Parent: 7, HasParent: true}
	for i := range n {
		ev.Hashes = append(ev.Hashes, prefix.Hash(1<<63+uint64(i)))
		for j := range 16 {
			ev.TokenIDs = append(ev.TokenIDs, uint32(i*16+j))
		}
	}
	return []engine.Event{ev}
}

func TestEncodeBatchLiteral(t *testing.T) {
	events := []engine.Event{
		{Kind: engine.Token}, // not a block event: skipped
		{Kind: engine.BlockStored, Hashes: []prefix.Hash{1, 1 << 63}, TokenIDs: []uint32{5, 6, 7, 8}, BlockSize: 2, LoRA: "sql"},
		{Kind: engine.BlockRemoved, Hashes: []prefix.Hash{1}},
		{Kind: engine.AllCleared},
	}
	lora := int64(2) // the second adapter given to the encoder
	tests := []struct {
		format string
		want   any
	}{
		{FormatArray, []any{2.5, []any{
			[]any{"BlockStored", []any{int64(1), uint64(1 << 63)}, nil, []any{int64(5), int64(6), int64(7), int64(8)},
				int64(2), lora, "GPU", "sql"},
			[]any{"BlockRemoved", []any{int64(1)}, "GPU"},
			[]any{"AllBlocksCleared"},
		}, int64(0)}},
		{FormatMap, []any{2.5, []any{
			map[string]any{"type": "BlockStored", "block_hashes": []any{int64(1), uint64(1 << 63)}, "parent_block_hash": nil,
				"token_ids": []any{int64(5), int64(6), int64(7), int64(8)}, "block_size": int64(2),
				"lora_id": lora, "medium": "GPU", "lora_name": "sql", "extra_keys": nil, "group_idx": int64(0)},
			map[string]any{"type": "BlockRemoved", "block_hashes": []any{int64(1)}, "medium": "GPU", "group_idx": int64(0)},
			map[string]any{"type": "AllBlocksCleared"},
		}, int64(0)}},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			payload := newBatchEncoder(tt.format, []string{"chat", "sql"}).encode(2.5, events)
			var got any
			dec := msgpack.NewDecoder(bytes.NewReader(payload))
			dec.UseLooseInterfaceDecoding(true)
			if err := dec.Decode(&got); err != nil {
				t.Fatal(err)
			}
			// msgpack's loose decoding picks int64 or uint64 by wire type:
			// compare integers by value.
			if diff := cmp.Diff(ints(tt.want), ints(got)); diff != "" {
				t.Errorf("batch (-want +got):\n%s", diff)
			}
		})
	}
	if got := newBatchEncoder(FormatMap, nil).encode(1, events[:1]); got != nil {
		t.Errorf("a batch without block events encodes to %d bytes, want nil", len(got))
	}
}

// ints returns v with every int64 turned into a uint64 (all integers in
// these batches are non-negative).
func ints(v any) any {
	switch x := v.(type) {
	case int64:
		return uint64(x)
	case []any:
		out := make([]any, len(x))
		for i := range x {
			out[i] = ints(x[i])
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = ints(e)
		}
		return out
	}
	return v
}

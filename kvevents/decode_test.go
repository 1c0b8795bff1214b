package kvevents

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vmihailenco/msgpack/v5"
)

// omap is a msgpack map with keys in the given order.
type omap []kv

type kv struct {
	k string
	v any
}

func (m omap) EncodeMsgpack(e *msgpack.Encoder) error {
	if err := e.EncodeMapLen(len(m)); err != nil {
		return err
	}
	for _, p := range m {
		if err := e.EncodeString(p.k); err != nil {
			return err
		}
		if err := e.Encode(p.v); err != nil {
			return err
		}
	}
	return nil
}

// pack encodes v with compact integers, as Python's msgpack does.
func pack(t testing.TB, v any) []byte {
	t.Helper()
	var b bytes.Buffer
	e := msgpack.NewEncoder(&b)
	e.UseCompactInts(true)
	if err := e.Encode(v); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func toks(from, n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

func utoks(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func hash32(last uint64) []byte {
	b := bytes.Repeat([]byte{0xAB}, 32)
	for i := range 8 {
		b[31-i] = byte(last >> (8 * i))
	}
	return b
}

func TestDecode(t *testing.T) {
	tests := []struct {
		name    string
		payload any
		want    Batch
	}{
		{
			name: "legacy arrays, trailing fields omitted, no rank",
			payload: []any{1.5, []any{
				[]any{"BlockStored", []any{11, 12}, nil, toks(100, 8), 4, nil, "GPU", nil},
				[]any{"BlockStored", []any{13}, 12, toks(108, 4), 4},
				[]any{"BlockStored", []any{14}, 13, toks(112, 4), 4, 7, "CPU", "ad", []any{[]any{"ad"}}, 0, "future"},
				[]any{"BlockRemoved", []any{11}},
				[]any{"BlockRemoved", []any{12}, "cpu", 1},
				[]any{"AllBlocksCleared"},
			}},
			want: Batch{TS: 1.5, Rank: -1, Events: []Event{
				{Kind: Stored, Hashes: []uint64{11, 12}, Tokens: utoks(100, 8), BlockSize: 4},
				{Kind: Stored, Hashes: []uint64{13}, Parent: 12, HasParent: true, Tokens: utoks(108, 4), BlockSize: 4},
				{Kind: Stored, Hashes: []uint64{14}, Parent: 13, HasParent: true, Tokens: utoks(112, 4), BlockSize: 4, LoRA: "ad", Medium: CPU},
				{Kind: Removed, Hashes: []uint64{11}},
				{Kind: Removed, Hashes: []uint64{12}, Medium: CPU, Group: 1},
				{Kind: Cleared},
			}},
		},
		{
			name: "maps in any key order, unknown keys and types, rank",
			payload: []any{2.0, []any{
				omap{{"token_ids", toks(100, 4)}, {"type", "BlockStored"}, {"block_hashes", []any{21}},
					{"parent_block_hash", 0}, {"new_field", omap{{"x", []any{1, 2}}}}, {"medium", "DISK"}, {"lora_name", "ad"},
					{"block_size", 4}, {"lora_id", 3}, {"extra_keys", nil}, {"group_idx", 2}},
				omap{{"type", "BlockUpdated"}, {"block_hashes", []any{1}}},
				omap{{"block_hashes", []any{21}}, {"type", "BlockRemoved"}, {"medium", "DISK"}},
				omap{{"type", "AllBlocksCleared"}},
			}, 3},
			want: Batch{TS: 2, Rank: 3, Events: []Event{
				{Kind: Stored, Hashes: []uint64{21}, Tokens: utoks(100, 4), BlockSize: 4, LoRA: "ad", Medium: Disk, Group: 2},
				{Kind: Removed, Hashes: []uint64{21}, Medium: Disk},
				{Kind: Cleared},
			}},
		},
		{
			name: "map batch, SGLang rank, hashes as int64 and bytes, no block size",
			payload: omap{{"attn_dp_rank", 1}, {"events", []any{
				omap{{"type", "BlockStored"}, {"block_hashes", []any{int64(-2), hash32(0x0102030405060708)}},
					{"parent_block_hash", hash32(99)}, {"token_ids", toks(0, 6)}},
			}}, {"ts", 3}},
			want: Batch{TS: 3, Rank: 1, Events: []Event{
				{Kind: Stored, Hashes: []uint64{1<<64 - 2, 0x0102030405060708}, Parent: 99, HasParent: true, Tokens: utoks(0, 6), BlockSize: 3},
			}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got Batch
			if err := Decode(pack(t, tt.payload), &got); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tt.want, got, cmpopts.IgnoreUnexported(Batch{}), cmpopts.EquateEmpty()); d != "" {
				t.Errorf("batch (-want +got):\n%s", d)
			}
		})
	}
}

func TestDecodeErrors(t *testing.T) {
	good := pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, toks(0, 4), 4}}})
	tests := []struct {
		name    string
		payload []byte
		want    string // part of the error
	}{
		{"empty", nil, "EOF"},
		{"truncated", good[:len(good)-1], "EOF"},
		{"trailing", append(bytes.Clone(good), 0xc0), "trailing"},
		{"not a batch", pack(t, "hello"), "array length"},
		{"short batch", pack(t, []any{1.0}), "at least 2"},
		{"map without events", pack(t, omap{{"ts", 1.0}}), "without events"},
		{"ts a string", pack(t, []any{"x", []any{}}), "ts"},
		{"events not an array", pack(t, []any{1.0, 5}), "events"},
		{"empty event", pack(t, []any{1.0, []any{[]any{}}}), "empty event"},
		{"tag not a string", pack(t, []any{1.0, []any{[]any{5}}}), "tag"},
		{"tokens do not fill blocks", pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1, 2}, nil, toks(0, 5), 4}}}), "token ids"},
		{"tokens without block size", pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1, 2}, nil, toks(0, 5)}}}), "token ids"},
		{"null hash", pack(t, []any{1.0, []any{[]any{"BlockRemoved", []any{nil}}}}), "null block hash"},
		{"float hash", pack(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1.5}}}}), "invalid code"},
		{"negative token", pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{-1}, 1}}}), "out of range"},
		{"huge array length", []byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff}, "exceeds"},
		{"huge string", []byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x91, 0xdb, 0xff, 0xff, 0xff, 0xff}, "string of"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b Batch
			err := Decode(tt.payload, &b)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

// TestDecoderReuse decodes a large batch then a small one with the same
// Decoder and Batch: nothing of the first leaks into the second.
func TestDecoderReuse(t *testing.T) {
	d := NewDecoder()
	var b Batch
	big := pack(t, []any{1.0, []any{[]any{"BlockStored", []any{1, 2, 3}, nil, toks(0, 12), 4, nil, "GPU", "lora"}}, 0})
	small := pack(t, []any{2.0, []any{[]any{"BlockRemoved", []any{9}}}})
	for _, p := range [][]byte{big, small} {
		if err := d.Decode(p, &b); err != nil {
			t.Fatal(err)
		}
	}
	want := Batch{TS: 2, Rank: -1, Events: []Event{{Kind: Removed, Hashes: []uint64{9}}}}
	if diff := cmp.Diff(want, b, cmpopts.IgnoreUnexported(Batch{}), cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if allocs := testing.AllocsPerRun(100, func() { d.Decode(big, &b) }); allocs != 0 {
		t.Errorf("Decode allocates %.0f times per batch, want 0", allocs)
	}
}

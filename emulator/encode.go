package emulator

import (
	"bytes"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvrouter/kvrouter/engine"
)

// Event encodings (KVEventsFormat).
const (
	// FormatMap encodes events as tagged maps, as vLLM >= 0.26 does:
	// {"type": "BlockStored", "block_hashes": [...], ...}.
	FormatMap = "map"
	// FormatArray encodes events as tagged arrays, as older vLLM does:
	// ["BlockStored", block_hashes, parent_block_hash, token_ids,
	// block_size, lora_id, medium, lora_name].
	FormatArray = "array"
)

// batchEncoder turns one step's block events into a msgpack event batch
// [ts, [event, ...], data_parallel_rank]. It is used by the engine goroutine
// only.
type batchEncoder struct {
	array   bool
	loraIDs map[string]int64 // adapter name → lora_id
	buf     bytes.Buffer
	enc     *msgpack.Encoder
}

// newBatchEncoder returns an encoder for format. Adapter loras[i] gets
// lora_id i+1, as vLLM numbers the adapters it loads at start-up.
func newBatchEncoder(format string, loras []string) *batchEncoder {
	b := &batchEncoder{array: format == FormatArray, loraIDs: map[string]int64{}}
	for i, name := range loras {
		b.loraIDs[name] = int64(i + 1)
	}
	b.enc = msgpack.NewEncoder(&b.buf)
	b.enc.UseCompactInts(true)
	return b
}

// encode returns a fresh payload for the block events among events, stamped
// ts (unix seconds), or nil if there are none.
func (b *batchEncoder) encode(ts float64, events []engine.Event) []byte {
	n := 0
	for i := range events {
		if isBlockEvent(events[i].Kind) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	b.buf.Reset()
	e := b.enc
	e.EncodeArrayLen(3)
	e.EncodeFloat64(ts)
	e.EncodeArrayLen(n)
	for i := range events {
		switch events[i].Kind {
		case engine.BlockStored:
			b.stored(&events[i])
		case engine.BlockRemoved:
			b.removed(&events[i])
		case engine.AllCleared:
			b.cleared()
		}
	}
	e.EncodeInt(0) // data_parallel_rank
	return bytes.Clone(b.buf.Bytes())
}

func isBlockEvent(k engine.Kind) bool {
	return k == engine.BlockStored || k == engine.BlockRemoved || k == engine.AllCleared
}

// key writes a map key in the map format and nothing in the array format.
func (b *batchEncoder) key(k string) {
	if !b.array {
		b.enc.EncodeString(k)
	}
}

func (b *batchEncoder) stored(ev *engine.Event) {
	e := b.enc
	if b.array {
		e.EncodeArrayLen(8)
		e.EncodeString("BlockStored")
	} else {
		e.EncodeMapLen(10)
		e.EncodeString("type")
		e.EncodeString("BlockStored")
	}
	b.key("block_hashes")
	b.hashes(ev)
	b.key("parent_block_hash")
	if ev.HasParent {
		e.EncodeUint(uint64(ev.Parent))
	} else {
		e.EncodeNil()
	}
	b.key("token_ids")
	e.EncodeArrayLen(len(ev.TokenIDs))
	for _, t := range ev.TokenIDs {
		e.EncodeUint(uint64(t))
	}
	b.key("block_size")
	e.EncodeInt(int64(ev.BlockSize))
	b.key("lora_id")
	if ev.LoRA == "" {
		e.EncodeNil()
	} else {
		e.EncodeInt(b.loraID(ev.LoRA))
	}
	b.key("medium")
	e.EncodeString(ev.Medium.String())
	b.key("lora_name")
	if ev.LoRA == "" {
		e.EncodeNil()
	} else {
		e.EncodeString(ev.LoRA)
	}
	if !b.array {
		e.EncodeString("extra_keys")
		e.EncodeNil()
		e.EncodeString("group_idx")
		e.EncodeInt(0)
	}
}

func (b *batchEncoder) removed(ev *engine.Event) {
	e := b.enc
	if b.array {
		e.EncodeArrayLen(3)
		e.EncodeString("BlockRemoved")
	} else {
		e.EncodeMapLen(4)
		e.EncodeString("type")
		e.EncodeString("BlockRemoved")
	}
	b.key("block_hashes")
	b.hashes(ev)
	b.key("medium")
	e.EncodeString(ev.Medium.String())
	if !b.array {
		e.EncodeString("group_idx")
		e.EncodeInt(0)
	}
}

func (b *batchEncoder) cleared() {
	if b.array {
		b.enc.EncodeArrayLen(1)
	} else {
		b.enc.EncodeMapLen(1)
		b.enc.EncodeString("type")
	}
	b.enc.EncodeString("AllBlocksCleared")
}

func (b *batchEncoder) hashes(ev *engine.Event) {
	b.enc.EncodeArrayLen(len(ev.Hashes))
	for _, h := range ev.Hashes {
		b.enc.EncodeUint(uint64(h))
	}
}

// loraID is the integer id of adapter name: its number among the loaded
// adapters, or for a name the encoder was not given a stable hash of it,
// 2^31..2^32-1, clear of those numbers.
func (b *batchEncoder) loraID(name string) int64 {
	if id, ok := b.loraIDs[name]; ok {
		return id
	}
	return 1<<31 + int64(xxhash.Sum64String(name)%(1<<31))
}

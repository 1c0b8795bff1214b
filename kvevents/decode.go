package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Decoder decodes event batches with vmihailenco/msgpack's low-level API,
// reusing its buffers: decoding a typical batch allocates nothing. A
// Decoder is not safe for concurrent use; the zero value is not usable
// (use NewDecoder).
type Decoder struct {
	p     []byte // the payload being decoded
	r     bytes.Reader
	d     *msgpack.Decoder
	key   []byte            // scratch for map keys and tags
	loras map[string]string // interned LoRA names
}

// NewDecoder returns a Decoder.
func NewDecoder() *Decoder {
	x := &Decoder{key: make([]byte, 0, 64), loras: map[string]string{}}
	x.d = msgpack.NewDecoder(&x.r)
	return x
}

// Decode decodes one batch payload into out with a fresh Decoder (see
// Decoder.Decode).
func Decode(payload []byte, out *Batch) error { return NewDecoder().Decode(payload, out) }

// errTrailing is returned for bytes after the batch.
var errTrailing = errors.New("trailing bytes after the batch")

// Decode decodes one batch payload into out, reusing out's memory: the
// batch is a positional array [ts, [events...], rank?] or a map {ts,
// events, data_parallel_rank | attn_dp_rank}; each event a legacy tagged
// array or a tagged map (any key order; unknown keys and event types are
// skipped). Bad input returns an error and never panics; out is then
// partially filled and must not be applied.
func (x *Decoder) Decode(payload []byte, out *Batch) error {
	out.reset()
	x.p = payload
	x.r.Reset(payload)
	if err := x.batch(out); err != nil {
		return fmt.Errorf("kv event batch: %w", err)
	}
	if x.r.Len() != 0 {
		return fmt.Errorf("kv event batch: %w (%d)", errTrailing, x.r.Len())
	}
	for i := range out.Events {
		s := out.spans[i]
		e := &out.Events[i]
		e.Hashes = out.hashes[s.h0:s.h1:s.h1]
		e.Tokens = out.tokens[s.t0:s.t1:s.t1]
	}
	return nil
}

func (x *Decoder) batch(out *Batch) error {
	c, err := x.d.PeekCode()
	if err != nil {
		return err
	}
	if isMap(c) {
		return x.batchMap(out)
	}
	n, err := x.arrayLen()
	if err != nil {
		return err
	}
	if n < 2 {
		return fmt.Errorf("batch array of %d fields, want at least 2", n)
	}
	if out.TS, err = x.d.DecodeFloat64(); err != nil {
		return fmt.Errorf("ts: %w", err)
	}
	if err := x.events(out); err != nil {
		return err
	}
	if n >= 3 {
		if out.Rank, err = x.optInt(); err != nil {
			return fmt.Errorf("data_parallel_rank: %w", err)
		}
	}
	return x.skip(n - 3)
}

func (x *Decoder) batchMap(out *Batch) error {
	n, err := x.mapLen()
	if err != nil {
		return err
	}
	seen := false
	for range n {
		k, err := x.str()
		if err != nil {
			return fmt.Errorf("batch key: %w", err)
		}
		switch string(k) {
		case "ts":
			out.TS, err = x.d.DecodeFloat64()
		case "events":
			err, seen = x.events(out), true
		case "data_parallel_rank", "attn_dp_rank":
			out.Rank, err = x.optInt()
		default:
			err = x.d.Skip()
		}
		if err != nil {
			return fmt.Errorf("batch field %q: %w", k, err)
		}
	}
	if !seen {
		return errors.New("batch map without events")
	}
	return nil
}

func (x *Decoder) events(out *Batch) error {
	n, err := x.arrayLen()
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	for i := range n {
		var e Event
		s := span{h0: len(out.hashes), t0: len(out.tokens)}
		ok, err := x.event(out, &e)
		if err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
		if !ok {
			out.hashes, out.tokens = out.hashes[:s.h0], out.tokens[:s.t0]
			continue
		}
		s.h1, s.t1 = len(out.hashes), len(out.tokens)
		if err := check(&e, s); err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
		out.Events = append(out.Events, e)
		out.spans = append(out.spans, s)
	}
	return nil
}

// check validates a stored event's token count against its hashes and
// fills BlockSize when absent.
func check(e *Event, s span) error {
	if e.Kind != Stored {
		return nil
	}
	nh, nt := s.h1-s.h0, s.t1-s.t0
	if nh == 0 {
		return nil
	}
	if e.BlockSize <= 0 {
		if nt%nh != 0 {
			return fmt.Errorf("%d token ids for %d blocks", nt, nh)
		}
		e.BlockSize = nt / nh
	}
	if nt != nh*e.BlockSize || e.BlockSize == 0 {
		return fmt.Errorf("%d token ids for %d blocks of %d", nt, nh, e.BlockSize)
	}
	return nil
}

// event decodes one event; ok is false for an unknown event type (skipped).
func (x *Decoder) event(out *Batch, e *Event) (ok bool, err error) {
	c, err := x.d.PeekCode()
	if err != nil {
		return false, err
	}
	if isMap(c) {
		return x.eventMap(out, e)
	}
	return x.eventArray(out, e)
}

// Positions of the legacy array encoding, after the tag.
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

func (x *Decoder) eventArray(out *Batch, e *Event) (bool, error) {
	n, err := x.arrayLen()
	if err != nil {
		return false, err
	}
	if n < 1 {
		return false, errors.New("empty event array")
	}
	tag, err := x.str()
	if err != nil {
		return false, fmt.Errorf("tag: %w", err)
	}
	e.Kind = kindOf(tag)
	var fields []string
	switch e.Kind {
	case Stored:
		fields = storedFields
	case Removed:
		fields = removedFields
	}
	for i := 1; i < n; i++ {
		if i-1 >= len(fields) {
			err = x.d.Skip()
		} else {
			err = x.field(out, e, fields[i-1])
		}
		if err != nil {
			return false, fmt.Errorf("%s field %d: %w", e.Kind, i, err)
		}
	}
	return e.Kind != 0, nil
}

func (x *Decoder) eventMap(out *Batch, e *Event) (bool, error) {
	n, err := x.mapLen()
	if err != nil {
		return false, err
	}
	for range n {
		k, err := x.str()
		if err != nil {
			return false, fmt.Errorf("key: %w", err)
		}
		if string(k) == "type" {
			tag, err := x.str()
			if err != nil {
				return false, fmt.Errorf("type: %w", err)
			}
			e.Kind = kindOf(tag)
			continue
		}
		// Keys of another event type are decoded all the same (and
		// harmless: apply reads only its kind's fields).
		name := fieldName(k)
		if name == "" {
			err = x.d.Skip()
		} else {
			err = x.field(out, e, name)
		}
		if err != nil {
			return false, fmt.Errorf("field %q: %w", name, err)
		}
	}
	return e.Kind != 0, nil
}

// fieldName returns the canonical (static) name of a known key, or "".
func fieldName(k []byte) string {
	for _, f := range storedFields {
		if string(k) == f {
			return f
		}
	}
	return ""
}

func kindOf(tag []byte) Kind {
	switch string(tag) {
	case "BlockStored":
		return Stored
	case "BlockRemoved":
		return Removed
	case "AllBlocksCleared":
		return Cleared
	}
	return 0
}

// field decodes the named field into e (and out's arenas).
func (x *Decoder) field(out *Batch, e *Event, name string) error {
	var err error
	switch name {
	case "block_hashes":
		out.hashes, err = x.hashes(out.hashes)
	case "parent_block_hash":
		e.Parent, e.HasParent, err = x.optHash()
	case "token_ids":
		out.tokens, err = x.tokens(out.tokens)
	case "block_size":
		e.BlockSize, err = x.optInt()
		if e.BlockSize > 1<<20 {
			return fmt.Errorf("block size %d", e.BlockSize)
		}
		e.BlockSize = max(e.BlockSize, 0)
	case "medium":
		e.Medium, err = x.medium()
	case "lora_name":
		e.LoRA, err = x.lora()
	case "group_idx":
		e.Group, err = x.optInt()
		e.Group = max(e.Group, 0)
	default: // lora_id, extra_keys
		err = x.d.Skip()
	}
	return err
}

func (x *Decoder) hashes(dst []uint64) ([]uint64, error) {
	n, err := x.arrayLen()
	if err != nil {
		return dst, err
	}
	for range n {
		if v, ok := x.fastInt(); ok {
			dst = append(dst, v)
			continue
		}
		h, ok, err := x.hash()
		if err != nil {
			return dst, err
		}
		if !ok {
			return dst, errors.New("null block hash")
		}
		dst = append(dst, h)
	}
	return dst, nil
}

// optHash decodes a parent hash: null or 0 means none.
func (x *Decoder) optHash() (uint64, bool, error) {
	h, ok, err := x.hash()
	return h, ok && h != 0, err
}

// hash decodes an integer or byte-string hash; ok is false for null.
func (x *Decoder) hash() (h uint64, ok bool, err error) {
	c, err := x.d.PeekCode()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c == msgpcode.Nil:
		return 0, false, x.d.DecodeNil()
	case msgpcode.IsString(c) || msgpcode.IsBin(c):
		b, err := x.str()
		if err != nil {
			return 0, false, err
		}
		return lastBE(b), true, nil
	}
	h, err = x.d.DecodeUint64()
	return h, err == nil, err
}

// lastBE returns the last 8 bytes of b as a big-endian integer (all of b
// if shorter).
func lastBE(b []byte) uint64 {
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b[len(b)-8:])
	}
	var h uint64
	for _, c := range b {
		h = h<<8 | uint64(c)
	}
	return h
}

func (x *Decoder) tokens(dst []uint32) ([]uint32, error) {
	n, err := x.arrayLen()
	if err != nil {
		return dst, err
	}
	for range n {
		t, ok := x.fastInt()
		if !ok {
			var err error
			if t, err = x.d.DecodeUint64(); err != nil {
				return dst, err
			}
		}
		if t > math.MaxUint32 {
			return dst, fmt.Errorf("token id %d out of range", t)
		}
		dst = append(dst, uint32(t))
	}
	return dst, nil
}

// medium decodes a tier name (case-insensitive); null means GPU.
func (x *Decoder) medium() (Medium, error) {
	b, err := x.optStr()
	if err != nil || b == nil {
		return GPU, err
	}
	switch {
	case bytes.EqualFold(b, []byte("GPU")), bytes.EqualFold(b, []byte("CUDA")):
		return GPU, nil
	case bytes.EqualFold(b, []byte("CPU")):
		return CPU, nil
	case bytes.EqualFold(b, []byte("DISK")):
		return Disk, nil
	}
	return OtherMedium, nil
}

// lora decodes an adapter name, interned so that a steady stream of the
// same names does not allocate.
func (x *Decoder) lora() (string, error) {
	b, err := x.optStr()
	if err != nil || len(b) == 0 {
		return "", err
	}
	if s, ok := x.loras[string(b)]; ok {
		return s, nil
	}
	if len(x.loras) >= 1024 { // bound memory against a stream of new names
		clear(x.loras)
	}
	s := string(b)
	x.loras[s] = s
	return s, nil
}

// optInt decodes an integer, null meaning -1.
func (x *Decoder) optInt() (int, error) {
	c, err := x.d.PeekCode()
	if err != nil {
		return 0, err
	}
	if c == msgpcode.Nil {
		return -1, x.d.DecodeNil()
	}
	v, err := x.d.DecodeInt64()
	if err != nil {
		return 0, err
	}
	if v < math.MinInt32 || v > math.MaxInt32 {
		return 0, fmt.Errorf("integer %d out of range", v)
	}
	return int(v), nil
}

// str reads a string or binary into the scratch buffer (valid until the
// next call).
func (x *Decoder) str() ([]byte, error) {
	b, err := x.optStr()
	if err == nil && b == nil {
		err = errors.New("null, want a string")
	}
	return b, err
}

// optStr reads a string or binary, nil for null.
func (x *Decoder) optStr() ([]byte, error) {
	n, err := x.d.DecodeBytesLen()
	if err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, nil
	}
	if n > x.r.Len() {
		return nil, fmt.Errorf("string of %d bytes in %d left", n, x.r.Len())
	}
	if cap(x.key) < n {
		x.key = make([]byte, n)
	}
	x.key = x.key[:n]
	return x.key, x.d.ReadFull(x.key)
}

// arrayLen decodes an array header whose length fits in what is left of
// the payload (each element takes a byte at least); null is an error.
func (x *Decoder) arrayLen() (int, error) {
	n, err := x.d.DecodeArrayLen()
	return x.length(n, err)
}

func (x *Decoder) mapLen() (int, error) {
	n, err := x.d.DecodeMapLen()
	if err == nil {
		n, err = x.length(n, nil)
	}
	return n, err
}

func (x *Decoder) length(n int, err error) (int, error) {
	switch {
	case err != nil:
		return 0, err
	case n < 0:
		return 0, errors.New("null, want an array or map")
	case n > x.r.Len():
		return 0, fmt.Errorf("length %d exceeds the %d bytes left", n, x.r.Len())
	}
	return n, nil
}

func (x *Decoder) skip(n int) error {
	for range n {
		if err := x.d.Skip(); err != nil {
			return err
		}
	}
	return nil
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

// fastInt reads an integer straight from the payload, bypassing the
// msgpack Decoder's reader calls (the hot path: token ids and hashes); ok
// is false, and nothing is consumed, for anything but a complete integer.
// Negative integers come out as two's complement.
func (x *Decoder) fastInt() (v uint64, ok bool) {
	pos := len(x.p) - x.r.Len()
	if pos >= len(x.p) {
		return 0, false
	}
	c := x.p[pos]
	var size int
	switch {
	case c <= 0x7f:
		x.r.Seek(int64(pos+1), io.SeekStart)
		return uint64(c), true
	case c >= 0xe0:
		x.r.Seek(int64(pos+1), io.SeekStart)
		return uint64(int64(int8(c))), true
	case c == msgpcode.Uint8 || c == msgpcode.Int8:
		size = 1
	case c == msgpcode.Uint16 || c == msgpcode.Int16:
		size = 2
	case c == msgpcode.Uint32 || c == msgpcode.Int32:
		size = 4
	case c == msgpcode.Uint64 || c == msgpcode.Int64:
		size = 8
	default:
		return 0, false
	}
	if pos+1+size > len(x.p) {
		return 0, false
	}
	b := x.p[pos+1 : pos+1+size]
	switch c {
	case msgpcode.Uint8:
		v = uint64(b[0])
	case msgpcode.Int8:
		v = uint64(int64(int8(b[0])))
	case msgpcode.Uint16:
		v = uint64(binary.BigEndian.Uint16(b))
	case msgpcode.Int16:
		v = uint64(int64(int16(binary.BigEndian.Uint16(b))))
	case msgpcode.Uint32:
		v = uint64(binary.BigEndian.Uint32(b))
	case msgpcode.Int32:
		v = uint64(int64(int32(binary.BigEndian.Uint32(b))))
	default:
		v = binary.BigEndian.Uint64(b)
	}
	x.r.Seek(int64(pos+1+size), io.SeekStart)
	return v, true
}

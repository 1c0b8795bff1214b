package kvevents

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
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

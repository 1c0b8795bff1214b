package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Value readers of the Decoder: hashes, token ids, tiers, names, lengths.

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

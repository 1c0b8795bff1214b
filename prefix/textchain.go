package prefix

import (
	"encoding/binary"
	"math/bits"
)

// xxhash64 primes.
const (
	xxPrime1 uint64 = 11400714785074694791
	xxPrime2 uint64 = 14029467366897019727
	xxPrime3 uint64 = 1609587929392839161
	xxPrime4 uint64 = 9650029242287828579
	xxPrime5 uint64 = 2870177450012600261
)

// chainBytes returns Chain(parent, b): xxhash64 of parent (8 bytes, little
// endian) followed by b, computed without copying them together. Text mode
// hashes its chunks in place with it, straight from the message strings.
func chainBytes(parent Hash, b []byte) Hash {
	n := 8 + len(b)
	var h uint64
	if n >= 32 {
		p1 := xxPrime1 // a variable, for wrapping arithmetic
		v1 := p1 + xxPrime2
		v2 := xxPrime2
		v3 := uint64(0)
		v4 := -p1
		// The first stripe is the parent and b's first 24 bytes.
		v1 = xxRound(v1, uint64(parent))
		v2 = xxRound(v2, binary.LittleEndian.Uint64(b[0:8]))
		v3 = xxRound(v3, binary.LittleEndian.Uint64(b[8:16]))
		v4 = xxRound(v4, binary.LittleEndian.Uint64(b[16:24]))
		b = b[24:]
		for len(b) >= 32 {
			v1 = xxRound(v1, binary.LittleEndian.Uint64(b[0:8:len(b)]))
			v2 = xxRound(v2, binary.LittleEndian.Uint64(b[8:16:len(b)]))
			v3 = xxRound(v3, binary.LittleEndian.Uint64(b[16:24:len(b)]))
			v4 = xxRound(v4, binary.LittleEndian.Uint64(b[24:32:len(b)]))
			b = b[32:len(b):len(b)]
		}
		h = bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
		h = xxMerge(h, v1)
		h = xxMerge(h, v2)
		h = xxMerge(h, v3)
		h = xxMerge(h, v4)
		h += uint64(n)
	} else {
		// Fewer than 32 bytes: the parent is the first 8-byte lane.
		h = xxPrime5 + uint64(n)
		h ^= xxRound(0, uint64(parent))
		h = bits.RotateLeft64(h, 27)*xxPrime1 + xxPrime4
	}
	for ; len(b) >= 8; b = b[8:] {
		h ^= xxRound(0, binary.LittleEndian.Uint64(b[:8]))
		h = bits.RotateLeft64(h, 27)*xxPrime1 + xxPrime4
	}
	if len(b) >= 4 {
		h ^= uint64(binary.LittleEndian.Uint32(b[:4])) * xxPrime1
		h = bits.RotateLeft64(h, 23)*xxPrime2 + xxPrime3
		b = b[4:]
	}
	for ; len(b) > 0; b = b[1:] {
		h ^= uint64(b[0]) * xxPrime5
		h = bits.RotateLeft64(h, 11) * xxPrime1
	}
	h ^= h >> 33
	h *= xxPrime2
	h ^= h >> 29
	h *= xxPrime3
	h ^= h >> 32
	return Hash(h)
}

func xxRound(acc, input uint64) uint64 {
	acc += input * xxPrime2
	acc = bits.RotateLeft64(acc, 31)
	return acc * xxPrime1
}

func xxMerge(acc, val uint64) uint64 {
	acc ^= xxRound(0, val)
	return acc*xxPrime1 + xxPrime4
}

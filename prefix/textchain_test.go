package prefix

import (
	"math/rand/v2"
	"testing"
)

// TestChainBytes checks chainBytes against Chain (xxhash.Sum64 of the
// parent and the bytes together) at every length around the stripe and
// lane boundaries.
func TestChainBytes(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 0))
	b := make([]byte, 300)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	for n := range len(b) {
		parent := Hash(rng.Uint64())
		if got, want := chainBytes(parent, b[:n]), Chain(parent, b[:n]); got != want {
			t.Errorf("length %d: chainBytes %x, Chain %x", n, got, want)
		}
	}
}

package prefix

import "testing"

func TestBlocksChainAndPrefix(t *testing.T) {
	a := make([]uint32, 40)
	for i := range a {
		a[i] = uint32(i)
	}
	root := Root("m", "")
	full := Blocks(root, a, 16, nil)
	if len(full) != 2 {
		t.Fatalf("got %d blocks, want 2 (the partial third is not hashed)", len(full))
	}
	short := Blocks(root, a[:16], 16, nil)
	if short[0] != full[0] {
		t.Errorf("first block hash differs between a prefix and the whole: %x vs %x", short[0], full[0])
	}
	b := append([]uint32(nil), a...)
	b[3] = 999
	other := Blocks(root, b, 16, nil)
	if other[0] == full[0] || other[1] == full[1] {
		t.Errorf("a change in block 0 must change every later hash: %x %x", other, full)
	}
	if Blocks(Root("other", ""), a, 16, nil)[0] == full[0] {
		t.Error("different models share a hash")
	}
	if Blocks(Root("m", "lora1"), a, 16, nil)[0] == full[0] {
		t.Error("different LoRA adapters share a hash")
	}
}

func TestChainTokensLongBlock(t *testing.T) {
	long := make([]uint32, 1000)
	for i := range long {
		long[i] = uint32(i * 7)
	}
	h1 := ChainTokens(1, long)
	long[999]++
	if ChainTokens(1, long) == h1 {
		t.Error("the last token of a long block does not reach the hash")
	}
}

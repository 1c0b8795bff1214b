package trace

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvrouter/kvrouter/prefix"
)

func req(segs ...Segment) Request {
	return Request{Segments: segs, Prompt: promptOf(segs)}
}

// common returns how many leading hashes a and b share.
func common(a, b []prefix.Hash) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func TestHashesShareLeadingBlocks(t *testing.T) {
	tests := []struct {
		name               string
		a, b               Request
		block              int
		wantA, wantB, want int // block counts and shared leading blocks
	}{
		{"shared prefix then unique question", req(Segment{1, 2048}, Segment{2, 128}), req(Segment{1, 2048}, Segment{3, 128}), 16, 136, 136, 128},
		{"boundary mid-block", req(Segment{1, 20}, Segment{2, 30}), req(Segment{1, 20}, Segment{3, 30}), 16, 3, 3, 1},
		{"shorter copy of a segment is a prefix", req(Segment{1, 20}, Segment{2, 30}), req(Segment{1, 20}, Segment{2, 12}), 16, 3, 2, 2},
		{"different first segment", req(Segment{1, 64}), req(Segment{2, 64}), 16, 4, 4, 0},
		{"same ids, other order", req(Segment{1, 16}, Segment{2, 16}), req(Segment{2, 16}, Segment{1, 16}), 16, 2, 2, 0},
		{"many tiny segments fold", req(seq(1, 40)...), req(seq(1, 40)...), 32, 1, 1, 1},
		{"tiny segments differ late", req(seq(1, 40)...), req(append(append(seq(1, 29), Segment{99, 1}), seq(31, 10)...)...), 32, 1, 1, 0},
		{"partial block not hashed", req(Segment{1, 15}), req(Segment{1, 15}), 16, 0, 0, 0},
		{"zero block size means 16", req(Segment{1, 33}), req(Segment{1, 33}), 0, 2, 2, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ha := tt.a.EngineHashes(tt.block, nil)
			hb := tt.b.EngineHashes(tt.block, nil)
			if len(ha) != tt.wantA || len(hb) != tt.wantB {
				t.Errorf("got %d and %d blocks, want %d and %d", len(ha), len(hb), tt.wantA, tt.wantB)
			}
			if got := common(ha, hb); got != tt.want {
				t.Errorf("got %d shared leading blocks, want %d", got, tt.want)
			}
			if got := tt.a.Blocks(tt.block); got != len(ha) {
				t.Errorf("Blocks: got %d, want %d", got, len(ha))
			}
		})
	}
}

// seq returns n one-token segments with ids first, first+1, ...
func seq(first uint64, n int) []Segment {
	s := make([]Segment, n)
	for i := range s {
		s[i] = Segment{first + uint64(i), 1}
	}
	return s
}

func TestHashesDistinctWithinRequest(t *testing.T) {
	r := req(Segment{1, 512}, Segment{1, 512}) // same content twice: still a chain
	h := r.EngineHashes(16, nil)
	seen := map[prefix.Hash]bool{}
	for _, x := range h {
		if seen[x] {
			t.Fatalf("hash %x repeats within one request", x)
		}
		seen[x] = true
	}
	if other := r.Hashes(prefix.Root("other", ""), 16, nil); other[0] == h[0] {
		t.Errorf("a different root gave the same first hash")
	}
}

func TestHashesAllocs(t *testing.T) {
	r := req(Segment{1, 2048}, Segment{2, 128})
	out := make([]prefix.Hash, 0, 256)
	if n := testing.AllocsPerRun(100, func() { out = r.EngineHashes(16, out[:0]) }); n != 0 {
		t.Errorf("got %v allocs per call, want 0", n)
	}
}

func TestPrefixKey(t *testing.T) {
	a := req(Segment{1, 20}, Segment{2, 30})
	b := req(Segment{1, 20}, Segment{2, 5}, Segment{3, 30})
	c := req(Segment{1, 20}, Segment{4, 30})
	if a.PrefixKey(25) != b.PrefixKey(25) {
		t.Errorf("equal first 25 tokens gave different keys")
	}
	if a.PrefixKey(25) == c.PrefixKey(25) {
		t.Errorf("different first 25 tokens gave equal keys")
	}
	if a.PrefixKey(20) != c.PrefixKey(20) {
		t.Errorf("equal first 20 tokens gave different keys")
	}
}

func TestText(t *testing.T) {
	a := req(Segment{7, 512}, Segment{8, 100})
	b := req(Segment{7, 300})
	ta, tb := a.Text(), b.Text()
	if !strings.HasPrefix(ta, tb) {
		t.Errorf("text of a shorter copy of segment 7 is not a prefix of the longer one")
	}
	if got := len(strings.Fields(ta)); got != a.Prompt {
		t.Errorf("got %d words, want %d (one per token)", got, a.Prompt)
	}
	if ta != a.Text() {
		t.Errorf("text is not deterministic")
	}
	c := req(Segment{9, 512})
	if c.Text() == string(AppendSegmentText(nil, Segment{7, 512})) {
		t.Errorf("different ids gave the same text")
	}
	if diff := cmp.Diff("model five house like ", string(AppendSegmentText(nil, Segment{1, 4}))); diff != "" {
		t.Logf("segment 1 text changed (-old +new):\n%s", diff)
	}
}

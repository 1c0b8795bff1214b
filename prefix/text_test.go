package prefix

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func mustParse(t testing.TB, body string) *Prompt {
	t.Helper()
	p, err := Parse([]byte(body))
	if err != nil {
		t.Fatalf("Parse(%q): %v", body, err)
	}
	return p
}

func hashes(t testing.TB, tx Text, body string) []Hash {
	t.Helper()
	h, _ := tx.Hashes(mustParse(t, body), nil)
	return h
}

// longText is deterministic filler of n bytes.
func longText(seed, n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "word%d-%d ", seed, i)
	}
	return b.String()[:n]
}

func isPrefix(a, b []Hash) bool { return len(a) <= len(b) && cmp.Equal(a, b[:len(a)]) }

func TestTextHashesMatchChain(t *testing.T) {
	// The streamed chunker must give exactly Chain over the materialised
	// rendering, cut into ChunkChars pieces.
	p := mustParse(t, `{"model":"m","messages":[{"role":"user","content":"hello there"}]}`)
	var r []byte
	r = append(r, 'M', 'r')
	r = append(r, "user"...)
	r = append(r, 0xFF, 'c')
	r = append(r, "hello there"...)
	r = append(r, 0xFF)
	tx := Text{ChunkChars: 8}
	got, _ := tx.Hashes(p, nil)
	var want []Hash
	h := Root("m", "")
	for i := 0; i+8 <= len(r); i += 8 {
		h = Chain(h, r[i:i+8])
		want = append(want, h)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("hashes differ from Chain over the rendering (-want +got):\n%s", diff)
	}
}

func TestTextPrefixProperties(t *testing.T) {
	sys := longText(1, 700)
	q1 := longText(2, 300)
	a1 := longText(3, 400)
	q2 := longText(4, 200)
	msg := func(role, content string) string { return fmt.Sprintf(`{"role":%q,"content":%q}`, role, content) }
	chat := func(model string, msgs ...string) string {
		return fmt.Sprintf(`{"model":%q,"messages":[%s]}`, model, strings.Join(msgs, ","))
	}
	turn1 := chat("m", msg("system", sys), msg("user", q1))
	turn2 := chat("m", msg("system", sys), msg("user", q1), msg("assistant", a1), msg("user", q2))
	tests := []struct {
		name       string
		a, b       string
		wantPrefix bool // a's hashes are a prefix of b's
		wantShared int  // -1: do not check; else exactly this many leading equal hashes
	}{
		{"one more turn extends the chain", turn1, turn2, true, -1},
		{"different model shares nothing", turn1, chat("other", msg("system", sys), msg("user", q1)), false, 0},
		{"early change changes every later hash", turn1, chat("m", msg("system", "X"+sys[1:]), msg("user", q1)), false, 0},
		{"content parts equal plain string", turn1,
			fmt.Sprintf(`{"model":"m","messages":[{"role":"system","content":[{"type":"text","text":%q}]},{"role":"user","content":[{"type":"text","text":%q}]}]}`, sys, q1),
			true, -1},
		{"growing completions prompt shares its chunks", `{"model":"m","prompt":"` + sys + `"}`, `{"model":"m","prompt":"` + sys + q1 + `"}`, true, -1},
		{"role is part of identity", chat("m", msg("user", sys)), chat("m", msg("system", sys)), false, 0},
		{"tools are part of identity", chat("m", msg("user", sys)), `{"model":"m","tools":[{"type":"function"}],"messages":[` + msg("user", sys) + `]}`, false, 0},
		// As the chat template renders them: after the system prompt.
		{"tools after the system prompt keep its chunks", turn1, `{"model":"m","tools":[{"type":"function"}],"messages":[` + msg("system", sys) + "," + msg("user", q1) + `]}`, false, -1},
		{"chat and completions never collide", `{"model":"m","prompt":"` + sys + `"}`, chat("m", msg("system", sys)), false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := hashes(t, Text{}, tc.a)
			b := hashes(t, Text{}, tc.b)
			if len(a) == 0 || len(b) == 0 {
				t.Fatalf("no hashes: %d, %d", len(a), len(b))
			}
			if got := isPrefix(a, b); got != tc.wantPrefix {
				t.Errorf("isPrefix = %v, want %v (len %d, %d)", got, tc.wantPrefix, len(a), len(b))
			}
			if tc.wantShared >= 0 {
				shared := 0
				for shared < min(len(a), len(b)) && a[shared] == b[shared] {
					shared++
				}
				if shared != tc.wantShared {
					t.Errorf("shared %d leading hashes, want %d", shared, tc.wantShared)
				}
				for i := range a {
					for j := range b {
						if a[i] == b[j] {
							t.Errorf("hash %d of a equals hash %d of b", i, j)
						}
					}
				}
			}
		})
	}
}

func TestTextSeparatorsUnambiguous(t *testing.T) {
	// Moving text across a message boundary must change the hashes.
	a := hashes(t, Text{ChunkChars: 8}, `{"model":"m","messages":[{"role":"user","content":"abcdefgh"},{"role":"user","content":"ijklmnop"}]}`)
	b := hashes(t, Text{ChunkChars: 8}, `{"model":"m","messages":[{"role":"user","content":"abcdefghi"},{"role":"user","content":"jklmnop"}]}`)
	if cmp.Equal(a, b) {
		t.Error("moving a character across a message boundary left the hashes equal")
	}
}

func TestTextChunkCountAndTokens(t *testing.T) {
	tests := []struct {
		name       string
		tx         Text
		body       string
		wantBlocks int
		wantTokens int
	}{
		// rendering: 'P' + 127 bytes = 128 → 2 chunks of 64.
		{"ascii prompt", Text{}, `{"model":"m","prompt":"` + strings.Repeat("a", 127) + `"}`, 2, 32},
		{"partial chunk not hashed", Text{}, `{"model":"m","prompt":"` + strings.Repeat("a", 126) + `"}`, 1, 32},
		{"chunk size", Text{ChunkChars: 16}, `{"model":"m","prompt":"` + strings.Repeat("a", 127) + `"}`, 8, 32},
		// 30 CJK characters, 90 bytes: 1 + 90 = 91 bytes → 1 chunk; 30 tokens.
		{"cjk", Text{}, `{"model":"m","prompt":"` + strings.Repeat("世", 30) + `"}`, 1, 30},
		// 40 ascii / 4 + 2 messages × 4.
		{"chat overhead", Text{}, `{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat("b", 20) + `"},{"role":"user","content":"` + strings.Repeat("c", 20) + `"}]}`, 0, 18},
		// 5 ids in the first prompt: 'I' + 20 bytes, 0 full chunks; 5+3 tokens.
		{"token ids", Text{}, `{"model":"m","prompt":[[1,2,3,4,5],[6,7,8]]}`, 0, 8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, tok := tc.tx.Hashes(mustParse(t, tc.body), nil)
			if len(h) != tc.wantBlocks {
				t.Errorf("got %d blocks, want %d", len(h), tc.wantBlocks)
			}
			if tok != tc.wantTokens {
				t.Errorf("got %d tokens, want %d", tok, tc.wantTokens)
			}
		})
	}
}

func TestEstimateMixedWords(t *testing.T) {
	// The word-at-a-time path must agree with a byte loop.
	for _, s := range []string{"héllo wörld, ça va? 日本語のテキスト 🙂🙂 plain ascii tail", strings.Repeat("é", 33), "abcdefgh日本",
		strings.Repeat("a", 40) + "日本" + strings.Repeat("b", 70) + "é" + strings.Repeat("c", 33)} {
		var e estimate
		e.addString(s)
		var ascii, other int
		for i := 0; i < len(s); i++ {
			if s[i] < 0x80 {
				ascii++
			} else if s[i] >= 0xC0 {
				other++
			}
		}
		if e.ascii != ascii || e.other != other {
			t.Errorf("%q: got ascii %d other %d, want %d %d", s, e.ascii, e.other, ascii, other)
		}
	}
}

func TestTokensPerBlock(t *testing.T) {
	for _, tc := range []struct{ chunk, want int }{{0, 16}, {64, 16}, {128, 32}, {2, 1}} {
		if got := (Text{ChunkChars: tc.chunk}).TokensPerBlock(); got != tc.want {
			t.Errorf("ChunkChars %d: got %d, want %d", tc.chunk, got, tc.want)
		}
	}
}

func TestTextHashesNoAlloc(t *testing.T) {
	p := chat32k()
	out := make([]Hash, 0, 1024)
	allocs := testing.AllocsPerRun(10, func() { Text{}.Hashes(p, out[:0]) })
	if allocs != 0 {
		t.Errorf("Hashes allocated %v times with a large enough out", allocs)
	}
}

// chat32k is a 32,000-character chat: a system prompt and 15 turns.
func chat32k() *Prompt {
	p := &Prompt{Model: "meta-llama/Llama-3.1-8B-Instruct", Chat: true}
	p.Messages = append(p.Messages, Message{Role: "system", Content: longText(0, 4000)})
	for i := range 14 {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		p.Messages = append(p.Messages, Message{Role: role, Content: longText(i+1, 2000)})
	}
	return p
}

// BenchmarkTextHash measures text-mode hashing of a 32,000-character chat
// (budget ≤ 50 µs).
//
//	go test -run='^$' -bench=BenchmarkTextHash -benchmem ./prefix
func BenchmarkTextHash(b *testing.B) {
	p := chat32k()
	out := make([]Hash, 0, 1024)
	b.ReportAllocs()
	b.SetBytes(32000)
	for b.Loop() {
		out, _ = Text{}.Hashes(p, out[:0])
	}
}

var _ = binary.LittleEndian

// BenchmarkTextHashEscapes measures text-mode hashing of 32,000 bytes of
// content dense with 0xFF (invalid UTF-8, which Parse keeps): every byte, or
// every other byte, is escaped.
//
//	go test -run='^$' -bench=BenchmarkTextHashEscapes -benchmem ./prefix
func BenchmarkTextHashEscapes(b *testing.B) {
	for _, tc := range []struct{ name, unit string }{{"all", "\xff"}, {"alternate", "\xffa"}, {"sparse", "\xff" + longText(0, 99)}} {
		b.Run("0xff="+tc.name, func(b *testing.B) {
			p := &Prompt{Model: "m", Chat: true, Messages: []Message{{Role: "user", Content: strings.Repeat(tc.unit, 32000/len(tc.unit))}}}
			out := make([]Hash, 0, 2048)
			b.ReportAllocs()
			b.SetBytes(32000)
			for b.Loop() {
				out, _ = Text{}.Hashes(p, out[:0])
			}
		})
	}
}

package emulator

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestTokenizeSplits(t *testing.T) {
	tests := []struct {
		text string
		want []string
	}{
		{"", []string{}},
		{"hello", []string{"hell", "o"}},
		{"hello world", []string{"hell", "o", " worl", "d"}},
		{"a  b", []string{"a", " ", " b"}},
		{"x\n\ny", []string{"x", "\n", "\n", "y"}},
		{"Hi, you!", []string{"Hi", ",", " you", "!"}},
		{"<|im_start|>user\n", []string{"<|im_start|>", "user", "\n"}},
		{"<|im_end|><|endoftext|>", []string{"<|im_end|>", "<|endoftext|>"}},
		{"<|nope|>", []string{"<", "|", "nope", "|", ">"}},
		{"naïve 日本語テキスト", []string{"naïv", "e", " 日本語テ", "キスト"}},
		{"tab\tend ", []string{"tab", "\t", "end", " "}},
	}
	for _, tt := range tests {
		t.Run(tt.text, func(t *testing.T) {
			ids, strs := TokenizeStrs(tt.text)
			if diff := cmp.Diff(tt.want, strs); diff != "" {
				t.Errorf("pieces (-want +got):\n%s", diff)
			}
			if got := strings.Join(strs, ""); got != tt.text {
				t.Errorf("pieces join to %q, want %q", got, tt.text)
			}
			if !slices.Equal(ids, Tokenize(tt.text)) {
				t.Errorf("TokenizeStrs ids differ from Tokenize")
			}
			if got := CountTokens(tt.text); got != len(ids) {
				t.Errorf("CountTokens = %d, want %d", got, len(ids))
			}
		})
	}
}

func TestTokenizeSpecialIDs(t *testing.T) {
	got := Tokenize("<|im_start|><|im_end|><|endoftext|>")
	want := []uint32{IMStart, IMEnd, EndOfText}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for _, id := range Tokenize("The quick brown fox jumps over the lazy dog") {
		if id >= VocabSize {
			t.Errorf("ordinary token id %d out of range", id)
		}
	}
}

func TestTokenizePrefixStable(t *testing.T) {
	tests := []struct {
		name string
		a, b string
	}{
		{"word then space", "hello", "hello world"},
		{"long word", "internationalization", "internationalization is long"},
		{"newline end", "line one\n", "line one\nline two"},
		{"double newline", "para\n", "para\n\nnext"},
		{"punctuation then space", "Hi there,", "Hi there, you"},
		{"special then newline", "<|im_start|>user\n", "<|im_start|>user\nhello"},
		{"unicode", "日本語テキスト", "日本語テキスト です"},
		{"chat turn", RenderChat([]Message{{Role: "user", Content: "What is KV cache reuse?"}}, true),
			RenderChat([]Message{
				{Role: "user", Content: "What is KV cache reuse?"},
				{Role: "assistant", Content: "the cat sat on a mat"},
				{Role: "user", Content: "And routing?"},
			}, true)},
		{"system prompt", RenderChat([]Message{{Role: "system", Content: "You are terse."}}, false),
			RenderChat([]Message{{Role: "system", Content: "You are terse."}, {Role: "user", Content: "hi"}}, true)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.HasPrefix(tt.b, tt.a) {
				t.Fatalf("test case: %q is not a prefix of %q", tt.a, tt.b)
			}
			a, b := Tokenize(tt.a), Tokenize(tt.b)
			if len(a) >= len(b) || !slices.Equal(a, b[:len(a)]) {
				t.Errorf("tokens of %q (%v) are not a proper prefix of tokens of %q (%v)", tt.a, a, tt.b, b)
			}
		})
	}
}

func TestRenderChat(t *testing.T) {
	got := RenderChat([]Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}}, true)
	want := "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestFillerOneTokenPerWord(t *testing.T) {
	for _, chat := range []bool{true, false} {
		var b strings.Builder
		for i := range 200 {
			b.WriteString(fillerWord(i, chat))
		}
		if got := CountTokens(b.String()); got != 200 {
			t.Errorf("chat=%v: 200 filler words tokenize to %d tokens, want 200", chat, got)
		}
	}
}

func BenchmarkTokenize(b *testing.B) {
	text := strings.Repeat("The quick brown fox jumps over the lazy dog, again and again.\n", 500)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		Tokenize(text)
	}
}

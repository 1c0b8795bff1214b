package hashing

import (
	"github.com/kvrouter/kvrouter/internal/qwen3"

	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/tokenizer"
)

// TestTokenModeQwen3: with the real Qwen3 tokenizer the router's hashes of
// a request are prefix.Blocks of the tokenizer's own ids for it (the chat
// template applied, tools included), the keys kvevents stores for an
// engine that computed those tokens.
func TestTokenModeQwen3(t *testing.T) {
	dir := qwen3.Dir(t)
	h, err := New(Config{Tokenizers: map[string]string{"qwen3": dir}, ChunkChars: 64})
	if err != nil {
		t.Fatal(err)
	}
	var tok *tokenizer.Tokenizer = h.tok.models["qwen3"].tok // tokenizer.Load(dir)
	msgs := `[{"role":"system","content":"You are a helpful assistant. Answer briefly, in the user's language."},` +
		`{"role":"user","content":"What is the weather in Paris? 今日は晴れですか 🌤"},` +
		`{"role":"assistant","content":"Let me check."},` +
		`{"role":"user","content":"Also: write a Go function that reverses a slice.\n\n    func rev(s []int) {}"}]`
	tools := `[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]`
	root := prefix.Root("qwen3", "")
	tests := []struct {
		name, body string
		want       func() ([]uint32, error)
	}{
		{"chat with tools", `{"model":"qwen3","messages":` + msgs + `,"tools":` + tools + `}`,
			func() ([]uint32, error) { return tok.Chat(json.RawMessage(msgs), json.RawMessage(tools), nil) }},
		{"chat", `{"model":"qwen3","messages":` + msgs + `}`,
			func() ([]uint32, error) { return tok.Chat(json.RawMessage(msgs), nil, nil) }},
		{"completion", `{"model":"qwen3","prompt":"The quick brown fox jumps over the lazy dog. 敏捷的棕色狐狸跳过了懒狗。 And again: the quick brown fox."}`,
			func() ([]uint32, error) {
				return tok.Encode("The quick brown fox jumps over the lazy dog. 敏捷的棕色狐狸跳过了懒狗。 And again: the quick brown fox.", nil), nil
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := prefix.Parse([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			ids, err := tc.want()
			if err != nil {
				t.Fatal(err)
			}
			var sc Scratch
			chains, n := h.Hash(p, root, []int{16, 32}, &sc)
			if len(chains) != 2 || n != len(ids) {
				t.Fatalf("%d chains, %d tokens; want 2 chains, %d tokens", len(chains), n, len(ids))
			}
			for _, c := range chains {
				want := prefix.Blocks(root, ids, c.Tokens, nil)
				if c.Tokens == 16 && len(want) == 0 || !slices.Equal(c.Hashes, want) {
					t.Errorf("block size %d: %d blocks, want %d; equal %v", c.Tokens, len(c.Hashes), len(want), slices.Equal(c.Hashes, want))
				}
			}
		})
	}
	if st := h.Stats(); st.Fails != 0 || st.Texted != 0 {
		t.Errorf("stats %+v, want no failures", st)
	}
	// A model without a tokenizer is hashed in text mode.
	p, _ := prefix.Parse([]byte(`{"model":"other","prompt":"hello hello hello hello hello hello hello hello hello hello hello hello hello"}`))
	var sc Scratch
	got, _ := h.Hash(p, root, []int{16}, &sc)
	want, _ := prefix.Text{ChunkChars: 64}.Hashes(p, nil)
	if len(got) != 1 || !slices.Equal(got[0].Hashes, want) || h.Stats().Texted != 1 {
		t.Errorf("other model: %v, want text mode %v", got, want)
	}
}

// BenchmarkTokenHashNewTurn: token mode's cost per request (render the
// chat template, tokenize, hash blocks) for a new turn of an
// already-seen conversation of about 8,000 Qwen3 tokens: the earlier
// messages hit the tokenizer's memos.
//
//	go test -run='^$' -bench=TokenHash -benchmem ./hashing
func BenchmarkTokenHashNewTurn(b *testing.B) {
	dir := os.Getenv("KVROUTER_QWEN3_DIR")
	if dir == "" {
		dir = filepath.Join("..", ".cache", "qwen3")
	}
	h, err := New(Config{Tokenizer: dir, ChunkChars: 64})
	if err != nil {
		b.Skip(err)
	}
	msgs := []prefix.Message{{Role: "system", Content: "You are a helpful assistant."}}
	for i := range 8 {
		msgs = append(msgs, prefix.Message{Role: "user", Content: words(i, 80)}, prefix.Message{Role: "assistant", Content: words(i+1000, 60)})
	}
	p := &prefix.Prompt{Model: "m", Chat: true, Messages: msgs}
	var sc Scratch
	root := prefix.Root("m", "")
	_, n := h.Hash(p, root, []int{16}, &sc)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		p.Messages = append(msgs, prefix.Message{Role: "user", Content: words(5000+i, 30)})
		h.Hash(p, root, []int{16}, &sc)
	}
	b.ReportMetric(float64(n), "tokens")
}

// TestRemoteFallback: without a healthy replica to ask, a request is
// hashed in text mode, counted; token-id prompts need no tokenizer.
func TestRemoteFallback(t *testing.T) {
	h, err := New(Config{Tokenizer: Remote, ChunkChars: 64, Pick: func() string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	root := prefix.Root("m", "")
	var sc Scratch
	p, _ := prefix.Parse([]byte(`{"model":"m","prompt":"` + strings.Repeat("abcd ", 40) + `"}`))
	got, _ := h.Hash(p, root, []int{16}, &sc)
	want, _ := prefix.Text{ChunkChars: 64}.Hashes(p, nil)
	if st := h.Stats(); len(got) != 1 || !slices.Equal(got[0].Hashes, want) || st.Fails != 1 || st.Texted != 1 {
		t.Errorf("fallback chains %v (want text mode %v), stats %+v", got, want, st)
	}
	p, _ = prefix.Parse([]byte(`{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}`))
	got, n := h.Hash(p, root, []int{16}, &sc)
	ids := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	if want := prefix.Blocks(root, ids, 16, nil); len(got) != 1 || !slices.Equal(got[0].Hashes, want) || n != 17 {
		t.Errorf("token-id prompt: %v (%d tokens), want %v (17)", got, n, want)
	}
	if got, _ := h.Hash(p, root, nil, &sc); len(got) != 0 {
		t.Errorf("no block size known: %d chains, want none", len(got))
	}
}

// words is n deterministic words of up to 4 letters, from seed.
func words(seed, n int) string {
	var b strings.Builder
	x := uint64(seed)*0x9E3779B97F4A7C15 + 1
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		for k := range 1 + x%4 {
			b.WriteByte(byte('a' + (x>>(8*k))%26))
		}
	}
	return b.String()
}

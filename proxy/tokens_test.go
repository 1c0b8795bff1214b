package proxy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"kvrouter/prefix"
	"kvrouter/tokenizer"
)

// qwen3Dir finds Qwen3's tokenizer files ($KVROUTER_QWEN3_DIR, else
// .cache/qwen3 at the module root, installed by .ci/run); without them the
// test skips, except in CI.
func qwen3Dir(t *testing.T) string {
	dir := os.Getenv("KVROUTER_QWEN3_DIR")
	if dir == "" {
		dir = filepath.Join("..", ".cache", "qwen3")
	}
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("Qwen3 tokenizer missing in CI (.ci/run installs it): %v", err)
		}
		t.Skipf("Qwen3 tokenizer not installed (run .ci/run once, or set KVROUTER_QWEN3_DIR): %v", err)
	}
	return dir
}

// TestTokenModeQwen3: with the real Qwen3 tokenizer the router's hashes of
// a request are prefix.Blocks of the tokenizer's own ids for it (the chat
// template applied, tools included), the keys kvevents stores for an
// engine that computed those tokens.
func TestTokenModeQwen3(t *testing.T) {
	dir := qwen3Dir(t)
	h, err := newTokenHasher(&Config{Tokenizers: map[string]string{"qwen3": dir}, ChunkChars: 64}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var tok *tokenizer.Tokenizer = h.models["qwen3"].tok // tokenizer.Load(dir)
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
			want := prefix.Blocks(root, ids, 16, nil)
			got, n := h.Hashes(p, nil)
			if len(want) == 0 || !slices.Equal(got, want) || n != len(ids) {
				t.Errorf("hashes %d blocks (%d tokens), want %d blocks (%d tokens); equal %v", len(got), n, len(want), len(ids), slices.Equal(got, want))
			}
		})
	}
	if h.fails.Load() != 0 || h.texted.Load() != 0 {
		t.Errorf("fails %d, text-mode requests %d", h.fails.Load(), h.texted.Load())
	}
	// A model without a tokenizer is hashed in text mode.
	p, _ := prefix.Parse([]byte(`{"model":"other","prompt":"hello hello hello hello hello hello hello hello hello hello hello hello hello"}`))
	got, _ := h.Hashes(p, nil)
	want, _ := prefix.Text{ChunkChars: 64}.Hashes(p, nil)
	if !slices.Equal(got, want) || h.texted.Load() != 1 {
		t.Errorf("other model: %v, want text mode %v", got, want)
	}
}

// BenchmarkTokenHashNewTurn: token mode's cost per request (render the
// chat template, tokenize, hash blocks) for a new turn of an
// already-seen conversation of about 8,000 Qwen3 tokens: the earlier
// messages hit the tokenizer's memos.
//
//	go test -run='^$' -bench=TokenHash -benchmem ./proxy
func BenchmarkTokenHashNewTurn(b *testing.B) {
	dir := os.Getenv("KVROUTER_QWEN3_DIR")
	if dir == "" {
		dir = filepath.Join("..", ".cache", "qwen3")
	}
	h, err := newTokenHasher(&Config{Tokenizer: dir, ChunkChars: 64}, nil)
	if err != nil {
		b.Skip(err)
	}
	msgs := []prefix.Message{{Role: "system", Content: "You are a helpful assistant."}}
	for i := range 8 {
		msgs = append(msgs, prefix.Message{Role: "user", Content: words(i, 80)}, prefix.Message{Role: "assistant", Content: words(i+1000, 60)})
	}
	p := &prefix.Prompt{Model: "m", Chat: true, Messages: msgs}
	_, n := h.Hashes(p, nil)
	var out []prefix.Hash
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		p.Messages = append(msgs, prefix.Message{Role: "user", Content: words(5000+i, 30)})
		out, _ = h.Hashes(p, out[:0])
	}
	b.ReportMetric(float64(n), "tokens")
}

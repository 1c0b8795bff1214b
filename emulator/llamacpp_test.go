package emulator

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	kvscrape "github.com/kvrouter/kvrouter/scrape"
)

// TestLlamaCppEngine: an emulator of a llama.cpp preset shows itself as
// llama-server does: llamacpp:* metrics, which the router's parser reads
// as a llama.cpp engine, and GET /slots with its slots and their
// context; a conversation's second turn reuses its first prompt from its
// slot, counted in the metrics.
func TestLlamaCppEngine(t *testing.T) {
	preset := filepath.Join(t.TempDir(), "llamacpp.yaml")
	if err := os.WriteFile(preset, []byte("engine: llamacpp\nmax-num-seqs: 2\nblock-size: 4\nkv-blocks: 2048\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := start(t, Config{Preset: preset})
	first := strings.Repeat("Tell me about the slots of llama.cpp, and how they keep the last prompt. ", 4)
	for _, prompt := range []string{first, first + "And then the host prompt cache?"} {
		if code, b := post(t, s.URL()+"/v1/completions", map[string]any{"model": "m", "prompt": prompt, "max_tokens": 4}); code != http.StatusOK {
			t.Fatalf("status %d: %s", code, b)
		}
	}
	resp, err := http.Get(s.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	l, err := kvscrape.Parse(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if l.Engine != kvscrape.EngineLlamaCpp || l.PrefixHits <= 0 || l.PrefixQueries <= l.PrefixHits {
		t.Errorf("metrics read as engine %q, %v of %v prompt tokens cached: want llamacpp, the second prompt's first reused", l.Engine, l.PrefixHits, l.PrefixQueries)
	}
	n, nCtx, err := kvscrape.Slots(context.Background(), func(ctx context.Context, url string) (io.ReadCloser, error) {
		resp, err := http.Get(url)
		if err != nil {
			return nil, err
		}
		return resp.Body, nil
	}, s.URL())
	if err != nil || n != 2 || nCtx != 4096 {
		t.Errorf("/slots: %d slots of %d tokens (%v), want 2 of 4096", n, nCtx, err)
	}
}

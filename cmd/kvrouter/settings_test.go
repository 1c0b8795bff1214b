package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"

	"github.com/kvrouter/kvrouter/proxy"
)

var updateSettings = flag.Bool("update-settings", false, "rewrite testdata/serve-settings.golden")

// settingValues are the values TestServeSettings sets a flag to, and
// writes its YAML key as, where the flag's type does not choose one.
var settingValues = map[string]struct{ flag, yaml string }{
	"backend":         {"http://h:1", "[http://h:1]"},
	"pass-through":    {"/a,/b", "[/a, /b]"},
	"trusted-proxies": {"10.0.0.0/8", "10.0.0.0/8"},
	"kv-events-allow": {"10.0.0.0/8,gw", "10.0.0.0/8,gw"},
	"slo-classes":     {"a=1s/50ms", "a=1s/50ms"},
	"panic-threshold": {"0.25", "0.25"}, // its default is 0.5
	"preset-file":     {"testdata/preset.yaml", "testdata/preset.yaml"},
}

// settingValue is a value for flag f unlike its default, and the same
// value written in YAML.
func settingValue(t *testing.T, f *flag.Flag) (string, string) {
	if v, ok := settingValues[f.Name]; ok {
		return v.flag, v.yaml
	}
	g, ok := f.Value.(flag.Getter)
	if !ok {
		t.Fatalf("--%s: no sample value for a %T: add one to settingValues", f.Name, f.Value)
	}
	var v string
	switch d := g.Get().(type) {
	case bool:
		v = fmt.Sprint(!d)
	case time.Duration:
		v = "7s"
	case int, int64, uint64:
		v = "7"
	case float64:
		v = "0.5"
	case string:
		v = "x7"
	default:
		t.Fatalf("--%s: no sample value for a %T: add one to settingValues", f.Name, d)
	}
	return v, v
}

// TestServeSettings pins serve's settings: every flag with its
// environment variable, its default and the YAML key it sets (a flag set
// to a value changes that key alone, and the key in a file gives the same
// configuration as the flag), and every YAML key of the defaults with its
// value. Settings moving between structs must leave this golden file as
// it is; a new setting adds its lines (go test -run TestServeSettings
// -update-settings).
func TestServeSettings(t *testing.T) {
	var b bytes.Buffer
	b.WriteString("# flag\tenvironment\tYAML key\tdefault\n")
	def := proxy.DefaultConfig()
	scratch := proxy.DefaultConfig()
	var path string
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	serveFlags(fs, &scratch, &path)
	dir := t.TempDir()
	fs.VisitAll(func(f *flag.Flag) {
		key := "-"
		if f.Name != "config" {
			key = flagKey(t, f, def, dir)
		}
		fmt.Fprintf(&b, "--%s\t%s\t%s\t%q\n", f.Name, envName(f.Name), key, f.DefValue)
	})
	b.WriteString("\n# YAML key: default\n")
	for _, kv := range yamlKeys(t, def) {
		b.WriteString(kv + "\n")
	}

	golden := filepath.Join("testdata", "serve-settings.golden")
	if *updateSettings {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(string(want), b.String()); d != "" {
		t.Errorf("serve's settings changed (-golden +now):\n%s", d)
	}
}

// flagKey sets flag f on a default configuration and returns the one YAML
// key that changed; the same value given under that key in a file must
// give the same configuration.
func flagKey(t *testing.T, f *flag.Flag, def proxy.Config, dir string) string {
	t.Helper()
	fv, yv := settingValue(t, f)
	byFlag := proxy.DefaultConfig()
	var path string
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	serveFlags(fs, &byFlag, &path)
	if err := fs.Set(f.Name, fv); err != nil {
		t.Fatalf("--%s=%s: %v", f.Name, fv, err)
	}
	keys := changedSettings(def, byFlag)
	if !reflect.DeepEqual(def.Backends, byFlag.Backends) {
		keys = append(keys, "backend")
	}
	if len(keys) != 1 {
		t.Errorf("--%s=%s changed the settings %q, want one", f.Name, fv, keys)
		return "?"
	}
	file := filepath.Join(dir, f.Name+".yaml")
	if err := os.WriteFile(file, []byte(keys[0]+": "+yv+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	byFile := proxy.DefaultConfig()
	if err := proxy.ReadConfigFile(file, &byFile); err != nil {
		t.Errorf("--%s: %v", f.Name, err)
	} else if !reflect.DeepEqual(byFlag, byFile) {
		t.Errorf("--%s=%s and %s: %s in a file differ:\n%s", f.Name, fv, keys[0], yv, cmp.Diff(byFlag, byFile, cmp.Exporter(func(reflect.Type) bool { return true })))
	}
	return keys[0]
}

// yamlKeys lists cfg's YAML keys with their values, sorted.
func yamlKeys(t *testing.T, cfg proxy.Config) []string {
	t.Helper()
	var n yaml.Node
	if err := n.Encode(cfg); err != nil {
		t.Fatal(err)
	}
	var out []string
	for i := 0; i+1 < len(n.Content); i += 2 {
		v, err := yaml.Marshal(n.Content[i+1])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, n.Content[i].Value+": "+string(bytes.TrimSpace(bytes.ReplaceAll(v, []byte("\n"), []byte(" ")))))
	}
	slices.Sort(out)
	return out
}

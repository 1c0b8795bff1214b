package main

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvrouter/kvrouter/proxy"
	"github.com/kvrouter/kvrouter/route"
)

func TestLoadServeConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "kvrouter.yaml")
	os.WriteFile(file, []byte("backend: [\"http://file:1\"]\npolicy: round-robin\nscrape-interval: 250ms\ndecisions: 7\nchunk-chars: 128\n"), 0o644)
	env := map[string]string{
		"KVROUTER_CONFIG":          file,
		"KVROUTER_POLICY":          "least-loaded",
		"KVROUTER_SCRAPE_INTERVAL": "300ms",
		"KVROUTER_BACKEND":         "http://env:1 http://env:2,kv=tcp://env:5557",
		"KVROUTER_TOKENIZER":       "remote",
	}
	getenv := func(k string) string { return env[k] }
	cfg, err := loadServeConfig([]string{"--policy", "kv-aware", "--backend", "http://flag:1"}, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"policy (flag over env)", cfg.Policy, "kv-aware"},
		{"backends (flag replaces env and file)", len(cfg.Backends), 1},
		{"backend", cfg.Backends[0].URL, "http://flag:1"},
		{"scrape interval (env over file)", cfg.ScrapeInterval, 300 * time.Millisecond},
		{"decisions (file over default)", cfg.Decisions, 7},
		{"chunk chars (file)", cfg.ChunkChars, 128},
		{"session header (default)", cfg.SessionHeader, "X-Session-ID"},
		{"session ttl (default)", cfg.SessionTTL, 10 * time.Minute},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	cfg, err = loadServeConfig(nil, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Backends) != 2 || cfg.Backends[1].KV != "tcp://env:5557" || cfg.Tokenizer != "remote" {
		t.Errorf("env backends: got %+v, tokenizer %q", cfg.Backends, cfg.Tokenizer)
	}
}

// TestLoadServeConfigPrecise: precise-mode and token-mode settings from
// flags and the file.
func TestLoadServeConfigPrecise(t *testing.T) {
	dir := t.TempDir()
	tok := filepath.Join(dir, "tok")
	os.Mkdir(tok, 0o755)
	os.WriteFile(filepath.Join(tok, "tokenizer.json"), []byte("{}"), 0o644)
	file := filepath.Join(dir, "kvrouter.yaml")
	os.WriteFile(file, []byte("backend: [\"http://a:1,kv=tcp://a:5557,replay=tcp://a:5558,model=big,model=big-alias\", \"http://b:1\"]\n"+
		"kv-events-bind: tcp://0.0.0.0:5557\ntokenizers: {big: "+tok+", small: remote}\n"), 0o644)
	cfg, err := loadServeConfig([]string{"--config", file, "--tokenizer", tok}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Precise() || !cfg.TokenMode() || cfg.Tokenizer != tok || cfg.Tokenizers["small"] != "remote" ||
		cfg.KVEventsBind != "tcp://0.0.0.0:5557" || cfg.Backends[0].Replay != "tcp://a:5558" || !slices.Equal(cfg.Backends[0].Models, []string{"big", "big-alias"}) {
		t.Errorf("config %+v", cfg)
	}
}

func TestLoadServeConfigErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("backend: [\"http://a:1\"]\nno-such-key: 1\n"), 0o644)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no backend", nil, "at least one"},
		{"bad scheme", []string{"--backend", "ftp://x"}, "scheme"},
		{"unknown backend option", []string{"--backend", "http://a:1,foo=bar"}, "unknown option"},
		{"unknown policy", []string{"--backend", "http://a:1", "--policy", "nope"}, "unknown policy"},
		{"negative size", []string{"--backend", "http://a:1", "--max-body-bytes", "0"}, "max-body-bytes"},
		{"negative session ttl", []string{"--backend", "http://a:1", "--session-ttl", "-1s"}, "session-ttl"},
		{"bad log level", []string{"--backend", "http://a:1", "--log-level", "loud"}, "log-level"},
		{"unknown yaml key", []string{"--config", bad}, "no-such-key"},
		{"kv events without tokenizer", []string{"--backend", "http://a:1,kv=tcp://a:5557"}, "need token mode"},
		{"bind without tokenizer", []string{"--backend", "http://a:1", "--kv-events-bind", "tcp://0.0.0.0:5557"}, "need token mode"},
		{"bad kv endpoint", []string{"--backend", "http://a:1,kv=a:5557", "--tokenizer", "remote"}, "kv=\"a:5557\""},
		{"bad bind", []string{"--backend", "http://a:1", "--kv-events-bind", "0.0.0.0:5557", "--tokenizer", "remote"}, "kv-events-bind"},
		{"replay without kv", []string{"--backend", "http://a:1,replay=tcp://a:5558", "--tokenizer", "remote"}, "replay= needs kv="},
		{"missing tokenizer dir", []string{"--backend", "http://a:1", "--tokenizer", "/nonexistent"}, "tokenizer.json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadServeConfig(tc.args, func(string) string { return "" }, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestBackendURLErrors: a backend URL without a scheme, with another
// scheme, or ending in /v1 is refused with a message that says how to fix
// it, whether it came from a flag, the environment or the config file.
func TestBackendURLErrors(t *testing.T) {
	dir := t.TempDir()
	file := func(body string) string {
		p := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_", " ", "_", "\n", "_").Replace(body)+".yaml")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	noScheme := `backend "localhost:8000": URL needs a scheme, e.g. http://localhost:8000`
	cases := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"flag without scheme", []string{"--backend", "localhost:8000"}, nil, noScheme},
		{"flag with options, without scheme", []string{"--backend", "localhost:8000,kv=tcp://localhost:5557"}, nil,
			`backend "localhost:8000,kv=tcp://localhost:5557": URL needs a scheme, e.g. http://localhost:8000`},
		{"environment", nil, map[string]string{"KVROUTER_BACKEND": "localhost:8000"}, "KVROUTER_BACKEND=\"localhost:8000\": " + noScheme},
		{"file, string form", []string{"--config", file("backend: [localhost:8000]\n")}, nil, "line 1: " + noScheme},
		{"file, mapping form", []string{"--config", file("backends:\n  - url: localhost:8000\n")}, nil, "line 2: " + noScheme},
		{"other scheme", []string{"--backend", "tcp://a:8000"}, nil, `backend "tcp://a:8000": scheme must be http or https, got "tcp"`},
		{"no host", []string{"--backend", "http://:8000"}, nil, `backend "http://:8000": no host`},
		{"path ending in /v1", []string{"--backend", "http://a:8000/v1/"}, nil,
			`backend "http://a:8000/v1/": give the server's base URL, without /v1 (the router appends each request's path), e.g. http://a:8000`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := loadServeConfig(c.args, func(k string) string { return c.env[k] }, io.Discard)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("got error %v, want one containing %q", err, c.want)
			}
		})
	}
}

// TestConfigBackendMappings: in the YAML file, backends are a list of
// mappings (url, kv, replay, models), strings in the flag's comma form, or
// both mixed, under backend or backends.
func TestConfigBackendMappings(t *testing.T) {
	dir := t.TempDir()
	want := []proxy.Backend{
		{URL: "http://a:8000", KV: "tcp://a:5557", Replay: "tcp://a:5558", Models: []string{"m", "lora-1"}},
		{URL: "http://b:8000", Models: []string{"m"}},
		{URL: "http://c:8000", KV: "tcp://c:5557", Models: []string{"n"}},
		{URL: "http://p:8000", Role: route.RolePrefill},
		{URL: "http://d:8000", Role: route.RoleDecode},
	}
	body := func(key string) string {
		return "tokenizer: remote\nkv-transfer: true\n" + key + ":\n" +
			"  - url: http://a:8000/\n    kv: tcp://a:5557\n    replay: tcp://a:5558\n    models: [m, lora-1]\n" +
			"  - url: http://b:8000\n    models: m\n" +
			"  - http://c:8000,kv=tcp://c:5557,model=n\n" +
			"  - url: http://p:8000\n    role: prefill\n" +
			"  - http://d:8000,role=decode\n"
	}
	for _, key := range []string{"backends", "backend"} {
		path := filepath.Join(dir, key+".yaml")
		os.WriteFile(path, []byte(body(key)), 0o644)
		cfg, err := loadServeConfig([]string{"--config", path}, func(string) string { return "" }, io.Discard)
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		if diff := cmp.Diff(want, cfg.Backends); diff != "" {
			t.Errorf("%s: backends (-want +got):\n%s", key, diff)
		}
	}
	bad := []struct{ name, body, want string }{
		{"unknown key", "backends:\n  - url: http://a:8000\n    kv_endpoint: tcp://a:5557\n", `line 3: backend: unknown key "kv_endpoint" (known: url, kv, replay, models, role, max_num_seqs, engine)`},
		{"unknown role", "backends:\n  - url: http://a:8000\n    role: prefil\n", `line 3: backend role: unknown role "prefil" (known: prefill, decode, both)`},
		{"no url", "backends:\n  - kv: tcp://a:5557\n", "line 2: backend: url is required"},
		{"both keys", "backend: [http://a:8000]\nbackends: [http://b:8000]\n", "both backend and backends are set"},
		{"not a list of backends", "backends:\n  - [http://a:8000]\n", "line 2: a backend is a string like http://host:port[,kv=...] or a mapping"},
	}
	for _, b := range bad {
		path := filepath.Join(dir, "bad.yaml")
		os.WriteFile(path, []byte(b.body), 0o644)
		_, err := loadServeConfig([]string{"--config", path}, func(string) string { return "" }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("%s: got error %v, want one containing %q", b.name, err, b.want)
		}
	}
	// Flags still replace the file's backends.
	path := filepath.Join(dir, "backends.yaml")
	cfg, err := loadServeConfig([]string{"--config", path, "--backend", "http://flag:1"}, func(string) string { return "" }, io.Discard)
	if err != nil || len(cfg.Backends) != 1 || cfg.Backends[0].URL != "http://flag:1" {
		t.Errorf("flag over file: got %+v, %v; want only http://flag:1", cfg.Backends, err)
	}
}

// TestConfigFileKeys: a misspelt top-level key of the --config file is
// an error naming the key, its line and the nearest real key, not the Go
// type the YAML decoder names; epp's own keys, taken out of the file
// before the decoder reads it, leave the other keys' line numbers as
// they are in its errors.
func TestConfigFileKeys(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	getenv := func(string) string { return "" }
	_, err := loadServeConfig([]string{"--config", write("typo.yaml", "backend: [\"http://a:1\"]\npolcy: kv-aware\n")}, getenv, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `line 2: unknown key "polcy" (did you mean policy?)`) || strings.Contains(err.Error(), "struct") {
		t.Errorf("typo: %v, want the key, its line and policy, no Go type", err)
	}
	var ef eppFlags
	_, err = loadConfig("epp", eppHelp, []string{"--config", write("epp.yaml", "fallbacks: 2\nbackend: [\"http://a:1\"]\nsession-ttl: soon\n")}, getenv, io.Discard, &ef)
	if err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Errorf("epp file with a bad value on line 3: %v, want line 3 named", err)
	}
}

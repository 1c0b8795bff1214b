package main

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
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

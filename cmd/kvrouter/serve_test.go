package main

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/proxy"
)

// TestLoadServeConfigSurface: the drain, key, TLS, admin and pass-through
// settings from their defaults, the environment, the file and flags.
func TestLoadServeConfigSurface(t *testing.T) {
	none := func(string) string { return "" }
	cfg, err := loadServeConfig([]string{"--backend", "http://a:1"}, none, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DrainTimeout != 60*time.Second || cfg.AdminListen != "127.0.0.1:9091" || cfg.APIKeys != "" || cfg.DebugShowIDs ||
		!slices.Equal(cfg.PassThrough, strings.Split(proxy.DefaultPassThrough, ",")) {
		t.Errorf("defaults: drain %v admin %q keys %q show-ids %v pass-through %v", cfg.DrainTimeout, cfg.AdminListen, cfg.APIKeys, cfg.DebugShowIDs, cfg.PassThrough)
	}
	file := filepath.Join(t.TempDir(), "kvrouter.yaml")
	os.WriteFile(file, []byte("backend: [\"http://a:1\"]\npass-through: [/v1/embeddings, /tokenize]\nadmin-listen: \"\"\ndebug-show-ids: true\n"), 0o644)
	cfg, err = loadServeConfig([]string{"--config", file}, none, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.PassThrough, []string{"/v1/embeddings", "/tokenize"}) || cfg.AdminListen != "" || !cfg.DebugShowIDs {
		t.Errorf("file: pass-through %v admin %q show-ids %v", cfg.PassThrough, cfg.AdminListen, cfg.DebugShowIDs)
	}
	env := map[string]string{"KVROUTER_PASS_THROUGH": "/", "KVROUTER_DRAIN_TIMEOUT": "5s"}
	cfg, err = loadServeConfig([]string{"--config", file, "--pass-through", ""}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.PassThrough) != 0 || cfg.DrainTimeout != 5*time.Second {
		t.Errorf("flag over env: pass-through %v (want none) drain %v (want 5s)", cfg.PassThrough, cfg.DrainTimeout)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-cert", "c.pem"}, "tls-cert and tls-key"},
		{[]string{"--admin-listen", "127.0.0.1:8000"}, "must differ from listen"},
		{[]string{"--pass-through", "sleep"}, "pass-through \"sleep\""},
		{[]string{"--drain-timeout", "-1s"}, "drain-timeout"},
	} {
		_, err := loadServeConfig(append(tc.args, "--backend", "http://a:1"), none, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
}

// TestAdminListenTaken: serve refuses to start when its admin address
// (the default one as any other: one code path) is taken, saying which
// and how to choose another, rather than run without its dashboard while
// the documented address shows another process's page.
func TestAdminListenTaken(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	var stderr strings.Builder
	err = serveTo(context.Background(), []string{"--listen", "127.0.0.1:0", "--admin-listen", held.Addr().String(), "--backend", "http://127.0.0.1:1"},
		func(string) string { return "" }, &stderr)
	if err == nil || !strings.Contains(err.Error(), "admin-listen "+held.Addr().String()) || !strings.Contains(err.Error(), `--admin-listen ""`) {
		t.Fatalf("serve with its admin address taken: %v, want an error naming it and the way out", err)
	}
}

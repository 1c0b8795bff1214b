package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/proxy"
)

// adminBackends returns the URLs GET /admin/v1/backends lists, sorted.
func adminBackends(admin string) ([]string, error) {
	resp, err := http.Get(admin + "/admin/v1/backends")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct{ Backends []proxy.BackendState }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	var urls []string
	for _, b := range out.Backends {
		urls = append(urls, b.URL)
	}
	slices.Sort(urls)
	return urls, nil
}

// counter returns the value of the sample of a counter whose line starts
// with prefix (name{labels} in the exposition's label order), or 0.
func counter(t *testing.T, admin, prefix string) float64 {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), prefix+" "); ok {
			v, _ := strconv.ParseFloat(rest, 64)
			return v
		}
	}
	return 0
}

// TestServeReloadsConfig runs kvrouter serve with a --config file and
// changes the file: a new backend list is applied (on change and on
// SIGHUP), an invalid file, or one that changes a setting applied only at
// start, is refused and the running list kept.
func TestServeReloadsConfig(t *testing.T) {
	var urls []string
	for range 3 {
		s, err := emulator.Start(emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: 0.01}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		urls = append(urls, s.URL())
	}
	slices.Sort(urls)
	path := filepath.Join(t.TempDir(), "kvrouter.yaml")
	write := func(body string) {
		// A distinct size or mtime each time: the watch compares both.
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	list := func(us ...string) string {
		q := make([]string, len(us))
		for i, u := range us {
			q[i] = strconv.Quote(u)
		}
		return fmt.Sprintf("policy: round-robin\nbackend: [%s]\n", strings.Join(q, ", "))
	}
	write(list(urls[0]))
	adminAddr := freeAddr(t)
	admin := "http://" + adminAddr
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runServe(ctx, []string{"--config", path, "--listen", freeAddr(t), "--admin-listen", adminAddr,
			"--config-poll-interval", "30ms", "--log-level", "error"})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("runServe: %v", err)
		}
	}()
	have := func(want ...string) func() bool {
		return func() bool { got, err := adminBackends(admin); return err == nil && slices.Equal(got, want) }
	}
	wait.For(t, "the router up with the file's backend", have(urls[0]))

	write(list(urls[0], urls[1]))
	wait.For(t, "the second backend added on change", have(urls[0], urls[1]))

	write("backend: [\"ftp://nowhere:1\"]\n")
	wait.For(t, "the invalid file counted", func() bool {
		return counter(t, admin, `kvrouter_config_reloads_total{result="error",trigger="change"}`) >= 1
	})
	if got, _ := adminBackends(admin); !slices.Equal(got, urls[:2]) {
		t.Errorf("after an invalid file: %v, want the running list %v", got, urls[:2])
	}

	write(list(urls[2], urls[1]) + "# the third\n")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the list replaced", have(urls[1], urls[2]))
	wait.For(t, "the SIGHUP reload counted", func() bool {
		return counter(t, admin, `kvrouter_config_reloads_total{result="ok",trigger="sighup"}`) >= 1
	})
	if got := counter(t, admin, `kvrouter_backend_changes_total{op="remove",result="ok",source="config"}`); got != 1 {
		t.Errorf("config removals counted: %v, want 1", got)
	}
	// A setting that applies only at start changed with the list: the
	// reload is refused, the running list kept.
	write(strings.Replace(list(urls[0]), "round-robin", "least-loaded", 1))
	wait.For(t, "the restart-only change refused", func() bool {
		return counter(t, admin, `kvrouter_config_reloads_total{result="error",trigger="change"}`) >= 2
	})
	if got, _ := adminBackends(admin); !slices.Equal(got, urls[1:]) {
		t.Errorf("after a policy change: %v, want the running list %v", got, urls[1:])
	}
	resp, err := http.Post("http://"+adminAddr+"/admin/v1/backends", "application/json", strings.NewReader("{"))
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("admin API on serve's admin listener: %d, want 400 for a bad body", resp.StatusCode)
		}
	}
}

func TestChangedSettings(t *testing.T) {
	a := proxy.DefaultConfig()
	b := a
	b.Backends = []proxy.Backend{{URL: "http://x:1"}}
	b.Policy, b.SessionTTL = "round-robin", time.Hour
	if got := changedSettings(a, b); !slices.Equal(got, []string{"policy", "session-ttl"}) {
		t.Errorf("got %v, want [policy session-ttl] (the backend list is applied, not named)", got)
	}
}

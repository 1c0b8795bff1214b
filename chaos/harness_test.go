package chaos

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/wait"
)

// long runs the long versions of the tests (the soak for 10 minutes, the
// fuzz-like floods for longer); CI runs the short ones.
var long = flag.Bool("chaos.long", false, "run the long chaos tests (10-minute soak, longer floods)")

// bin is the kvrouter binary the tests run as real processes, built once
// by TestMain without the race detector (the processes are the system under
// test; the tests themselves still run with it).
var bin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvrouter-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "kvrouter")
	build := exec.Command("go", "build", "-o", bin, "github.com/kvrouter/kvrouter/cmd/kvrouter")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building kvrouter:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a kvrouter process: an engine or a router.
type proc struct {
	t    *testing.T
	cmd  *exec.Cmd
	addr string // host:port it serves HTTP on
	// admin is a router's admin listener (/metrics, /ui, /debug/*),
	// host:port; empty for an engine, or a router started without one.
	admin string
	out   *syncBuffer
	done  chan struct{}
	err   error // the process's exit error, once done is closed
}

// URL returns the process's base URL.
func (p *proc) URL() string { return "http://" + p.addr }

// AdminURL returns a router's admin base URL (its /metrics, /ui, /debug).
func (p *proc) AdminURL() string {
	if p.admin == "" {
		p.t.Fatal("the router was started without an admin listener")
	}
	return "http://" + p.admin
}

// Log returns what the process wrote to stderr and stdout so far.
func (p *proc) Log() string { return p.out.String() }

// Signal sends sig to the process.
func (p *proc) Signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v: %v", sig, err)
	}
}

// Wait waits up to d for the process to exit and returns its exit code
// (-1 when killed by a signal).
func (p *proc) Wait(d time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		p.t.Fatalf("process did not exit within %v; log:\n%s", d, p.Log())
	}
	return p.cmd.ProcessState.ExitCode()
}

// RSS returns the process's resident set size in bytes, from
// /proc/<pid>/status.
func (p *proc) RSS() int64 {
	p.t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		p.t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				p.t.Fatal(err)
			}
			return kb << 10
		}
	}
	p.t.Fatal("no VmRSS in /proc status")
	return 0
}

// Alive reports whether the process has not exited.
func (p *proc) Alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// start runs `kvrouter args...` on a free loopback port given as
// --listen, and waits until its /health answers at all (any status).
// The process is killed at the end of the test.
func start(t *testing.T, args ...string) *proc {
	t.Helper()
	addr := freeAddr(t)
	cmd := exec.Command(bin, append(args, "--listen", addr)...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, addr: addr, out: out, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT) // a stopped process cannot die
		cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s log:\n%s", args[0], out.String())
		}
	})
	wait.Within(t, 15*time.Second, "kvrouter "+args[0]+" serving on "+addr, func() bool {
		if !p.Alive() {
			t.Fatalf("kvrouter %s exited before serving on %s", args[0], addr) // the cleanup logs why
		}
		resp, err := http.Get(p.URL() + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
	return p
}

// startEngine runs an emulated engine (`kvrouter engine`) with args.
func startEngine(t *testing.T, args ...string) *proc {
	return start(t, append([]string{"engine"}, args...)...)
}

// startRouter runs a router (`kvrouter serve`) in front of engines, with
// extra args, and its admin listener on a free address unless args give
// --admin-listen.
func startRouter(t *testing.T, engines []*proc, args ...string) *proc {
	a := []string{"serve", "--health-interval", "100ms", "--scrape-interval", "100ms", "--client-headers"} // the tests attribute replies by X-Kvrouter-Replica
	for _, e := range engines {
		a = append(a, "--backend", e.URL())
	}
	admin := ""
	if !slices.Contains(args, "--admin-listen") {
		admin = freeAddr(t)
		a = append(a, "--admin-listen", admin)
	}
	for i, v := range args {
		if v == "--admin-listen" && i+1 < len(args) {
			admin = args[i+1]
		}
	}
	p := start(t, append(a, args...)...)
	p.admin = admin
	return p
}

// waitReady waits until url answers 200 at path.
func waitReady(t *testing.T, url, path string, within time.Duration) {
	t.Helper()
	wait.Within(t, within, url+path+" answering 200", func() bool {
		resp, err := http.Get(url + path)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// metricsText returns the Prometheus text a process serves at
// url+"/metrics" (a router's admin URL, or an engine's URL), on a
// connection closed after it, so that the process is left holding none of
// the test's (the soak counts its connections).
func metricsText(t *testing.T, url string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	return string(b)
}

// freeAddr returns a loopback address no one listens on right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// chat returns a chat completion body for model "emulated".
func chat(content string, maxTokens int, stream bool) []byte {
	return fmt.Appendf(nil, `{"model":"emulated","messages":[{"role":"user","content":%q}],"max_tokens":%d,"stream":%t}`,
		content, maxTokens, stream)
}

// post sends body to url+path and returns the response.
func post(ctx context.Context, t *testing.T, url, path string, body []byte, header ...string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return http.DefaultClient.Do(req)
}

// syncBuffer is a bytes.Buffer safe for a process's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

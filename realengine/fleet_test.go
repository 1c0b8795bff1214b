package realengine

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/proxy"
	"github.com/kvrouter/kvrouter/scrape"
)

// model is the name the replicas serve their model under (--alias).
const model = "tiny"

// slots is each replica's slots (-np): the requests it runs at once.
const slots = 2

// build returns .cache/llamacpp (llama-server and model.gguf): it skips
// the test when it is not built, or fails it under CI=true, whose .ci/run
// builds it first.
func build(t *testing.T) (server, gguf string) {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".cache", "llamacpp"))
	if err != nil {
		t.Fatal(err)
	}
	server, gguf = filepath.Join(dir, "bin", "llama-server"), filepath.Join(dir, "model.gguf")
	for _, f := range []string{server, gguf} {
		if _, err := os.Stat(f); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s: %v (CI runs scripts/llamacpp.sh before the tests)", f, err)
			}
			t.Skipf("%s: %v: run scripts/llamacpp.sh to build llama-server and its model", f, err)
		}
	}
	return server, gguf
}

// freePort returns a loopback port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// replica is one llama-server process.
type replica struct {
	URL string
	cmd *exec.Cmd
}

// kill ends the process at once (a crashed engine).
func (r *replica) kill() {
	r.cmd.Process.Kill()
	r.cmd.Wait()
}

// startReplica starts llama-server on a free loopback port with the
// model, two slots of 4,096 tokens, its metrics on and one thread, and
// waits until its /health answers 200. Its log goes to the test's
// temporary directory; the process ends with the test.
func startReplica(t *testing.T) *replica {
	t.Helper()
	server, gguf := build(t)
	port := freePort(t)
	logf, err := os.Create(filepath.Join(t.TempDir(), "llama-server.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(server, "-m", gguf, "--alias", model, "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"-np", strconv.Itoa(slots), "-c", strconv.Itoa(slots*4096), "-t", "1", "--metrics", "--no-warmup")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &replica{URL: fmt.Sprintf("http://127.0.0.1:%d", port), cmd: cmd}
	t.Cleanup(func() {
		r.kill()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("%s log (last 2 kB):\n%s", r.URL, b[max(0, len(b)-2048):])
		}
	})
	// A minute: the process loads its model while other tests run.
	wait.Within(t, time.Minute, "llama-server "+r.URL+" healthy", func() bool {
		resp, err := http.Get(r.URL + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return r
}

// startFleet starts n replicas.
func startFleet(t *testing.T, n int) []*replica {
	t.Helper()
	reps := make([]*replica, n)
	for i := range reps {
		reps[i] = startReplica(t)
	}
	return reps
}

// kvrouter is a router run in process: its API's URL and its metrics.
type kvrouter struct {
	*proxy.Router
	URL string
	reg *prometheus.Registry
}

// metric sums the router's metric family name over its label sets.
func (k *kvrouter) metric(t *testing.T, name string) float64 {
	t.Helper()
	fams, err := k.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return v
}

// router runs kvrouter in process with policy and tokenizer ("" text
// mode, proxy.Remote the replicas' own) over reps and any extra backends
// (not waited for), once it has read every replica's metrics and slots.
func router(t *testing.T, policy, tokenizer string, reps []*replica, extra ...proxy.Backend) *kvrouter {
	t.Helper()
	cfg := proxy.DefaultConfig()
	cfg.Policy = policy
	cfg.Tokenizer = tokenizer
	cfg.ScrapeInterval = 100 * time.Millisecond
	cfg.HealthInterval = 200 * time.Millisecond
	cfg.Decisions = 4096
	cfg.ClientHeaders = true // X-Kvrouter-Replica and the decision, for loadgen
	for _, r := range reps {
		cfg.Backends = append(cfg.Backends, proxy.Backend{URL: r.URL})
	}
	cfg.Backends = append(cfg.Backends, extra...)
	reg := prometheus.NewRegistry()
	logf, err := os.Create(filepath.Join(t.TempDir(), "kvrouter.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("kvrouter's warnings and errors:\n%s", b[max(0, len(b)-4096):])
		}
	})
	log := slog.New(slog.NewTextHandler(logf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rt, err := proxy.New(cfg, proxy.Deps{Registry: reg, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	srv := httptest.NewServer(rt.Handler())
	t.Cleanup(srv.Close)
	// Routed before the router read the engines' metrics and slots, the
	// first requests would be priced as on an idle vLLM.
	wait.For(t, "the router scraped every replica as llama.cpp", func() bool {
		v := rt.View(time.Now())
		for _, r := range v.Replicas[:len(reps)] {
			if r.Engine != scrape.EngineLlamaCpp || r.MaxSeqs != slots {
				return false
			}
		}
		return true
	})
	return &kvrouter{Router: rt, URL: srv.URL, reg: reg}
}

// counts are a fleet's own counters, summed over its replicas.
type counts struct {
	// Prompt is the prompt tokens looked up, Cached those reused.
	Prompt, Cached float64
	// Generated is the tokens generated.
	Generated float64
}

// hitRate is Cached / Prompt.
func (c counts) hitRate() float64 {
	if c.Prompt == 0 {
		return 0
	}
	return c.Cached / c.Prompt
}

// engineCounts reads every replica's /metrics with the router's own
// parser (scrape.Parse) and sums them.
func engineCounts(t *testing.T, reps []*replica) counts {
	t.Helper()
	var c counts
	for _, r := range reps {
		resp, err := http.Get(r.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		l, err := scrape.Parse(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if l.Engine != scrape.EngineLlamaCpp {
			t.Fatalf("%s: metrics of engine %q, want llamacpp", r.URL, l.Engine)
		}
		c.Prompt += l.PrefixQueries
		c.Cached += l.PrefixHits
		c.Generated += l.GenerationTokens
	}
	return c
}

package proxy

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/loadgen"
	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/sim"
	"github.com/kvrouter/kvrouter/trace"
)

// loopScale is the emulated engines' time scale in the recording loop:
// wall seconds per engine second.
const loopScale = 0.02

// TestRecordingLoop is the loop an operator runs on their own traffic:
// four emulated engines behind a recording router, a built-in workload
// replayed through it, then the simulator on the recording. The policy
// that served the recording, simulated on it, finds the engines' own hit
// rate within 3 points, and the recording's prefix structure is the
// workload's: as many distinct shared prefixes, the same reuse per
// request. Text mode (the default: block tokens estimated, calibrated
// when read) and token mode (the engines' /tokenize: exact blocks).
func TestRecordingLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("replays a workload through four emulated engines, twice")
	}
	w, err := trace.Generate("multi-turn-chat", trace.GenOptions{Seed: 5, Requests: 120})
	if err != nil {
		t.Fatal(err)
	}
	w.Scale(0.25) // sessions four times as close: a shorter run, some load
	for _, mode := range []string{"text", "tokens"} {
		t.Run(mode, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "rec.jsonl")
			live := recordReplay(t, w.Requests, path, mode == "tokens")
			rec, err := trace.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if len(rec.Requests) != len(w.Requests) {
				t.Fatalf("%d requests recorded, %d sent", len(rec.Requests), len(w.Requests))
			}
			rec.Scale(1 / loopScale) // wall time to the engines' time
			preset, err := engine.Preset(engine.DefaultPreset)
			if err != nil {
				t.Fatal(err)
			}
			run, err := sim.Run(sim.Config{Workload: rec.Name, Requests: rec.Requests, Replicas: 4, Preset: preset,
				PresetName: engine.DefaultPreset, Policies: []string{"kv-aware"}, Seed: 1})
			if err != nil {
				t.Fatal(err)
			}
			simulated := run.Policies[0].HitRate
			t.Logf("%s mode: engines' hit rate live %.1f%%, simulated on the recording %.1f%%", mode, 100*live, 100*simulated)
			if math.Abs(simulated-live) > 0.03 {
				t.Errorf("simulated hit rate %.1f%%, live %.1f%%: more than 3 points apart", 100*simulated, 100*live)
			}
			ws, rs := structureOf(w.Requests), structureOf(rec.Requests)
			t.Logf("workload: %d shared prefixes, %.1f%% of blocks reused, requests by tenth reused %v; recording: %d, %.1f%%, %v",
				ws.shared, 100*ws.reused, ws.tenths, rs.shared, 100*rs.reused, rs.tenths)
			if ws.shared != rs.shared {
				t.Errorf("%d distinct shared prefixes in the recording, %d in the workload", rs.shared, ws.shared)
			}
			if math.Abs(ws.reused-rs.reused) > 0.03 {
				t.Errorf("%.1f%% of blocks reused in the recording, %.1f%% in the workload", 100*rs.reused, 100*ws.reused)
			}
			if mode == "text" {
				// A text-mode id is a chunk of the rendering, about 18
				// tokens here: where a prompt stops sharing, the chunk
				// across the boundary, and the partial one at its end, are
				// its own. A request loses a chunk or two of reuse, which
				// moves some from one tenth to the next: that is the
				// rounding of text mode, measured by reused above.
				return
			}
			for i := range ws.tenths {
				if d := ws.tenths[i] - rs.tenths[i]; d < -2 || d > 2 {
					t.Errorf("requests reusing %d0-%d0%% of their prompt: %d in the recording, %d in the workload", i, i+1, rs.tenths[i], ws.tenths[i])
				}
			}
		})
	}
}

// recordReplay replays reqs through a kv-aware router recording to path
// in front of four emulated engines, and returns the engines' own hit
// rate (their prefix-cache counters).
func recordReplay(t *testing.T, reqs []trace.Request, path string, tokens bool) float64 {
	t.Helper()
	var reps []*emulator.Server
	for range 4 {
		s, err := emulator.Start(emulator.Config{Model: "m", TimeScale: loopScale}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		reps = append(reps, s)
	}
	cfg := DefaultConfig()
	cfg.Policy, cfg.TimeScale = "kv-aware", loopScale
	cfg.ScrapeInterval = 10 * time.Millisecond
	cfg.Record.Path = path
	if tokens {
		cfg.Tokenizer = Remote
	}
	for _, s := range reps {
		cfg.Backends = append(cfg.Backends, Backend{URL: s.URL()})
	}
	rt, err := New(cfg, Deps{Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	srv := httptest.NewServer(rt.Handler())
	defer srv.Close()
	// Token mode hashes in the engines' block sizes, known from their
	// first scrape: before it a request is recorded without ids.
	wait.For(t, "the engines' block size known", func() bool { return len(rt.st.fleet.BlockSizes()) > 0 })
	res, err := loadgen.Run(context.Background(), loadgen.Config{Target: srv.URL, Model: "m", Requests: reqs,
		TimeScale: loopScale, Duration: 3 * time.Minute, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	if tt := res.Totals(); tt.OK != len(reqs) {
		t.Fatalf("%d of %d requests ok: %v", tt.OK, len(reqs), tt.Errors)
	}
	srv.Close() // every handler returned, as serve's drain waits for
	cancel()    // Run stops the recording, its queue written
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var f loadgen.EngineFigures
	for _, s := range reps {
		g, err := loadgen.ScrapeEngine(context.Background(), http.DefaultClient, s.URL())
		if err != nil {
			t.Fatal(err)
		}
		f = f.Add(g)
	}
	return f.HitRate()
}

// structure is a workload's prefix sharing, on 16-token engine blocks:
// shared counts the distinct shared prefixes (the last block a request
// shares with an earlier one, for those that share any), reused is the
// fraction of all blocks shared with an earlier request, tenths the
// requests by the tenth of their prompt's blocks they share.
type structure struct {
	shared int
	reused float64
	tenths [11]int
}

func structureOf(reqs []trace.Request) structure {
	var s structure
	seen := map[prefix.Hash]bool{}
	ends := map[prefix.Hash]bool{}
	var reused, blocks int
	for _, r := range reqs {
		hs := r.EngineHashes(16, nil)
		n := 0
		for n < len(hs) && seen[hs[n]] {
			n++
		}
		if n > 0 {
			ends[hs[n-1]] = true
		}
		if len(hs) > 0 {
			s.tenths[10*n/len(hs)]++
		}
		reused, blocks = reused+n, blocks+len(hs)
		for _, h := range hs {
			seen[h] = true
		}
	}
	s.shared = len(ends)
	if blocks > 0 {
		s.reused = float64(reused) / float64(blocks)
	}
	return s
}

// TestRecordingHoldsNoSecret: requests carrying prompt text, a session
// header and an OpenAI user field, chat and completions, recorded: the
// recording has a line for each and not one of their words, the session
// id or the user anywhere in it.
func TestRecordingHoldsNoSecret(t *testing.T) {
	reps := replicas(t, 2, 0.01)
	path := filepath.Join(t.TempDir(), "rec.jsonl")
	rt, url, admin := serveLimited(t, func(c *Config) { c.Record.Path = path }, urls(reps)...)
	t.Cleanup(func() { rt.StopRecording() })
	prompt := words(42, 200)
	secrets := []string{"sess-Zq81-private", "alice.secret@example.com"}
	bodies := []string{
		fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"max_tokens":4}`, prompt),
		fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}],"max_tokens":4,"user":%q}`, prompt+" more", secrets[1]),
		fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":4,"stream":true}`, prompt),
	}
	for i, b := range bodies {
		endpoint := "/v1/chat/completions"
		if i == 2 {
			endpoint = "/v1/completions"
		}
		if resp, body := do(t, "POST", url+endpoint, b, "X-Session-ID", secrets[0]); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if resp, body := do(t, "DELETE", admin+pathRecord, ""); resp.StatusCode != 200 || !strings.Contains(body, `"written":3`) {
		t.Fatalf("stop: %d %s; want 200, 3 written", resp.StatusCode, body)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(b, []byte("\n")); n != 3 {
		t.Errorf("%d lines, want 3:\n%s", n, b)
	}
	for _, s := range append(strings.Fields(prompt), append(secrets, "more", "alice", "Zq81")...) {
		if bytes.Contains(b, []byte(s)) {
			t.Errorf("the recording holds %q", s)
		}
	}
}

// TestRecordAdminAPI: the admin API starts a recording (201, with its
// path), refuses a second (409) and a body it cannot read (400), shows
// its status and stops it (200, what it wrote).
func TestRecordAdminAPI(t *testing.T) {
	reps := replicas(t, 1, 0.01)
	dir := t.TempDir()
	t.Chdir(dir) // no --record: the admin API's files go in the working directory
	if err := os.Mkdir("sub", 0o755); err != nil {
		t.Fatal(err)
	}
	// Planted in the directory: a link to a file the router may write,
	// and a FIFO, whose open would block the admin API.
	if err := os.Symlink(filepath.Join(dir, "precious"), "link.jsonl"); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo("fifo.jsonl", 0o600); err != nil {
		t.Fatal(err)
	}
	rt, url, admin := serveLimited(t, nil, urls(reps)...)
	t.Cleanup(func() { rt.StopRecording() })
	for _, c := range []struct {
		method, body string
		status       int
		want         string
	}{
		{"GET", "", 200, `"recording":false`},
		{"POST", "", 400, "no file"},
		{"POST", `{"path":1}`, 400, "invalid_body"},
		{"POST", `{"path":"rec.jsonl","sample_rate":2}`, 400, "record-sample-rate"},
		{"POST", `{"path":"sub"}`, 400, "record_failed"}, // a directory
		{"POST", `{"path":"link.jsonl"}`, 400, "symbolic link"},
		{"POST", `{"path":"fifo.jsonl"}`, 400, "not a regular file"},
		{"POST", `{"path":"rec.jsonl","max_bytes":1}`, 400, "record-max-bytes"},
		{"POST", `{"path":"rec.jsonl","backups":100000000}`, 400, "record-backups"},
		// A path, not a file name: no socket creates or renames files
		// outside the recordings' directory.
		{"POST", `{"path":"` + filepath.Join(dir, "rec.jsonl") + `"}`, 400, "must be a file name"},
		{"POST", `{"path":"../rec.jsonl"}`, 400, "must be a file name"},
		{"POST", `{"path":".."}`, 400, "must be a file name"},
		// The key file is confined as the recording is.
		{"POST", `{"path":"rec.jsonl","key_file":"/dev/zero"}`, 400, "must be a file name"},
		{"POST", `{"path":"rec.jsonl","key_file":"/proc/self/environ"}`, 400, "must be a file name"},
		{"POST", `{"path":"rec.jsonl","key_file":"../key"}`, 400, "must be a file name"},
		{"POST", `{"path":"rec.jsonl","key_file":"nokey"}`, 400, "record_failed"}, // read in the directory: absent there
		{"POST", `{"path":"rec.jsonl","sample_rate":1}`, 201, `"recording":true`},
		{"POST", `{"path":"rec.jsonl"}`, 409, "stop it first"},
		{"GET", "", 200, `"path":"rec.jsonl"`},
	} {
		if resp, body := do(t, c.method, admin+pathRecord, c.body); resp.StatusCode != c.status || !strings.Contains(body, c.want) {
			t.Errorf("%s %s: %d %s; want %d with %s", c.method, c.body, resp.StatusCode, body, c.status, c.want)
		}
	}
	if _, err := os.Lstat("precious"); !os.IsNotExist(err) {
		t.Errorf("the link's target: %v, want it never created", err)
	}
	do(t, "POST", url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi there"}],"max_tokens":2}`)
	if resp, body := do(t, "DELETE", admin+pathRecord, ""); resp.StatusCode != 200 || !strings.Contains(body, `"written":1`) || !strings.Contains(body, `"recording":false`) {
		t.Errorf("DELETE: %d %s; want 200, stopped, 1 written", resp.StatusCode, body)
	}
	if v := metricValue(t, admin, "kvrouter_record_lines_total"); v != 1 {
		t.Errorf("kvrouter_record_lines_total %v, want 1", v)
	}
}

// TestRecordAdminAPIDirectory: with --record, the admin API's files go in
// its directory.
func TestRecordAdminAPIDirectory(t *testing.T) {
	reps := replicas(t, 1, 0.01)
	dir := t.TempDir()
	rt, _, admin := serveLimited(t, func(c *Config) { c.Record.Path = filepath.Join(dir, "first.jsonl") }, urls(reps)...)
	t.Cleanup(func() { rt.StopRecording() })
	if resp, body := do(t, "DELETE", admin+pathRecord, ""); resp.StatusCode != 200 {
		t.Fatalf("DELETE: %d %s", resp.StatusCode, body)
	}
	if resp, body := do(t, "POST", admin+pathRecord, `{"path":"second.jsonl"}`); resp.StatusCode != 201 || !strings.Contains(body, filepath.Join(dir, "second.jsonl")) {
		t.Fatalf("POST second.jsonl: %d %s; want 201 with the file in %s", resp.StatusCode, body, dir)
	}
	if _, err := os.Stat(filepath.Join(dir, "second.jsonl")); err != nil {
		t.Errorf("the recording is not in --record's directory: %v", err)
	}
}

// TestRecordingUnwritable: a recording whose file cannot be opened any
// more (its path turned into a FIFO, found at a reopen on SIGHUP) costs
// the requests nothing: each is answered, the reopen does not block, and
// what was lost is in /metrics.
func TestRecordingUnwritable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rec.jsonl")
	reps := replicas(t, 1, 0.01)
	rt, url, admin := serveLimited(t, func(c *Config) { c.Record.Path = path }, urls(reps)...)
	t.Cleanup(func() { rt.StopRecording() })
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	rt.ReopenRecording()
	wait.For(t, "the failed reopen counted", func() bool {
		return metricValue(t, admin, "kvrouter_record_errors_total", "op", "open") > 0
	})
	for i := range 5 {
		if resp, body := do(t, "POST", url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":2}`); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	wait.For(t, "the lost requests counted", func() bool {
		return metricValue(t, admin, "kvrouter_record_dropped_total", "reason", "write_error") == 5
	})
	if v := metricValue(t, admin, "kvrouter_record_lines_total"); v != 0 {
		t.Errorf("kvrouter_record_lines_total %v with no file to write", v)
	}
	if st := rt.RecordStatus(); !strings.Contains(st.LastErr, "not a regular file") {
		t.Errorf("last error %q, want it to say not a regular file", st.LastErr)
	}
}

package record

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/trace"
)

var epoch = time.Unix(1_800_000_000, 0)

// entry is a request of session s arriving at ms, whose prompt is the
// block hashes given.
func entry(ms int, s string, hashes ...uint64) *Entry {
	return &Entry{At: epoch.Add(time.Duration(ms) * time.Millisecond), InputTokens: 16*len(hashes) + 5, OutputTokens: 7,
		CachedTokens: 16, BlockTokens: 16, Hashes: hashes, Session: s, Model: "m", Priority: 2, Outcome: "ok"}
}

func start(t *testing.T, cfg Config) (*Recorder, *Metrics) {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	r, err := Start(cfg, m, slog.New(slog.DiscardHandler), epoch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r, m
}

// TestRoundTrip: what the recorder writes, trace.ReadFile reads back as
// the same requests: arrival times, lengths, sessions kept apart and
// whole, shared leading blocks shared, the rest of a prompt its own.
func TestRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rec.jsonl")
	r, _ := start(t, Config{Path: path})
	r.Add(entry(0, "alice", 1, 2, 3))
	r.Add(entry(1500, "bob", 1, 2, 9))
	r.Add(entry(250, "alice", 1, 2, 3, 4))
	r.Stop()
	r.Add(entry(2000, "carol", 5)) // after the recording: dropped, counted
	if st := r.Status(); st.Written != 3 || st.Dropped != 1 || st.Recording {
		t.Errorf("status %+v: want 3 written, 1 dropped, stopped", st)
	}
	w, err := trace.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 3 {
		t.Fatalf("%d requests read, want 3", len(w.Requests))
	}
	a0, a1, b := w.Requests[0], w.Requests[1], w.Requests[2]
	if a0.At != 0 || a1.At != 250*time.Millisecond || b.At != 1500*time.Millisecond {
		t.Errorf("arrivals %v %v %v, want 0s 250ms 1.5s", a0.At, a1.At, b.At)
	}
	if a0.Session == "" || a0.Session != a1.Session || a0.Session == b.Session {
		t.Errorf("sessions %q %q %q: want alice's two equal, bob's another", a0.Session, a1.Session, b.Session)
	}
	if a1.Prompt != 16*4+5 || a1.Output != 7 {
		t.Errorf("prompt %d output %d, want %d and 7", a1.Prompt, a1.Output, 16*4+5)
	}
	h0, h1, hb := a0.EngineHashes(16, nil), a1.EngineHashes(16, nil), b.EngineHashes(16, nil)
	if len(h0) != 3 || len(h1) != 4 || len(hb) != 3 {
		t.Fatalf("%d, %d, %d engine blocks, want 3, 4, 3", len(h0), len(h1), len(hb))
	}
	if h0[2] != h1[2] || hb[1] != h0[1] || hb[2] == h0[2] {
		t.Errorf("blocks shared wrongly: alice's turns %v %v, bob %v", h0, h1, hb)
	}
	// The 5 tokens past the full blocks are each request's own.
	if t0, t1 := a0.Segments[len(a0.Segments)-1], a1.Segments[3]; t0.Tokens != 5 || t0.ID == t1.ID {
		t.Errorf("tails %+v %+v: want 5 tokens of the request's own", t0, t1)
	}
}

// TestNothingToJoin: a recording holds neither the session ids nor the
// block hashes it was given, only keyed ids; two recordings of the same traffic
// under different keys share no hash id nor session; under one key file
// they share all.
func TestNothingToJoin(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(key, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	record := func(name, keyFile string) map[string]bool {
		path := filepath.Join(dir, name)
		r, _ := start(t, Config{Path: path, KeyFile: keyFile})
		for i := range 50 {
			r.Add(entry(i, fmt.Sprintf("user-%d@example.com", i%7), uint64(i%5), uint64(1000+i), uint64(0xdeadbeef)))
		}
		r.Stop()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{"example.com", "user-", "3735928559", "deadbeef"} {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s holds %q", name, s)
			}
		}
		return ids(t, b)
	}
	a, b := record("a.jsonl", ""), record("b.jsonl", "")
	k1, k2 := record("k1.jsonl", key), record("k2.jsonl", key)
	if len(a) < 50 {
		t.Fatalf("%d ids in a recording of 57 blocks and 7 sessions", len(a))
	}
	for id := range a {
		if b[id] {
			t.Errorf("id %s in both recordings with random keys", id)
		}
		if k1[id] {
			t.Errorf("id %s in a random-key and a key-file recording", id)
		}
	}
	if len(k1) != len(a) || len(k1) != len(k2) {
		t.Errorf("%d, %d ids under one key, %d under a random one: want equal counts", len(k1), len(k2), len(a))
	}
	for id := range k1 {
		if !k2[id] {
			t.Errorf("id %s in one recording under the key file, not the other", id)
		}
	}
}

// ids returns a recording's hash ids and sessions.
func ids(t *testing.T, b []byte) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for l := range bytes.Lines(b) {
		var v struct {
			HashIDs []uint64 `json:"hash_ids"`
			Session string   `json:"session"`
		}
		if err := json.Unmarshal(l, &v); err != nil {
			t.Fatal(err)
		}
		for _, h := range v.HashIDs {
			if h > MaxHashID {
				t.Errorf("hash id %d past 2^53", h)
			}
			out[fmt.Sprint(h)] = true
		}
		out[v.Session] = true
	}
	return out
}

// TestSampleBySession: a sample keeps about its rate of sessions, each
// session whole.
func TestSampleBySession(t *testing.T) {
	k, err := NewKeys([]byte("a fixed key for the test"))
	if err != nil {
		t.Fatal(err)
	}
	kept := 0
	for i := range 4000 {
		s := fmt.Sprintf("session-%d", i)
		in := k.Sampled(s, 0.25)
		for range 3 {
			if k.Sampled(s, 0.25) != in {
				t.Fatalf("session %s sampled and not", s)
			}
		}
		if in {
			kept++
		}
	}
	if kept < 900 || kept > 1100 {
		t.Errorf("%d of 4000 sessions kept at rate 0.25, want 1000 ± 100", kept)
	}
}

// TestRotation: past its cap the file is renamed FILE.1 (the older to
// FILE.2 ...), at most Backups kept, each file starting with its
// start_unix_ms, and the rotated files read as one trace in order.
func TestRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rec.jsonl")
	r, m := start(t, Config{Path: path, MaxBytes: MinMaxBytes, Backups: 2, Queue: 1})
	for i := range 160 {
		r.Add(entry(i*10, "s", uint64(i)))
		wait.For(t, "the line written", func() bool { return r.Status().Written > int64(i) })
	}
	r.Stop()
	names, _ := filepath.Glob(path + "*")
	if len(names) != 3 {
		t.Fatalf("files %v, want rec.jsonl, .1 and .2", names)
	}
	if got := value(m.rotations); got < 3 {
		t.Errorf("%v rotations, want several", got)
	}
	for _, p := range names {
		b, _ := os.ReadFile(p)
		if len(b) > MinMaxBytes || !bytes.HasPrefix(b, []byte(`{"start_unix_ms":`)) {
			t.Errorf("%s: %d bytes, starting %.20q: want at most %d, starting with start_unix_ms", p, len(b), b, MinMaxBytes)
		}
	}
	paths, err := trace.Expand(path + "*")
	if err != nil {
		t.Fatal(err)
	}
	w, err := trace.ReadFiles(paths...)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(w.Requests); i++ {
		if d := w.Requests[i].At - w.Requests[i-1].At; d != 10*time.Millisecond {
			t.Fatalf("requests %d and %d are %v apart, want 10ms (the kept tail, in order)", i-1, i, d)
		}
	}
}

// value reads a counter.
func value(c prometheus.Counter) float64 {
	var m dto.Metric
	c.Write(&m)
	return m.GetCounter().GetValue()
}

// TestQueueFull: a writer that cannot keep up costs Add nothing: past the
// queue's bound requests are dropped and counted, none below it.
func TestQueueFull(t *testing.T) {
	dir := t.TempDir()
	r, m := start(t, Config{Path: filepath.Join(dir, "rec.jsonl"), Queue: 8})
	// Flood faster than the writer writes.
	t0 := time.Now()
	for i := range 100_000 {
		r.Add(entry(i, "s", 1, 2, 3))
	}
	took := time.Since(t0)
	r.Stop()
	st := r.Status()
	if st.Written+st.Dropped != 100_000 {
		t.Errorf("%d written + %d dropped, want 100000", st.Written, st.Dropped)
	}
	if st.Dropped == 0 {
		t.Skip("the writer kept up with 100000 adds; nothing to check")
	}
	if got := value(m.dropped.WithLabelValues("queue_full")); got != float64(st.Dropped) {
		t.Errorf("kvrouter_record_dropped_total{reason=queue_full} %v, want %d", got, st.Dropped)
	}
	t.Logf("100000 adds in %v, %d dropped", took, st.Dropped)
}

// TestUnwritable: a file that cannot be opened fails Start (the router
// does not start recording); one that goes away is reopened on Reopen,
// and an open failure then is counted and logged.
func TestUnwritable(t *testing.T) {
	dir := t.TempDir()
	if _, err := Start(Config{Path: filepath.Join(dir, "no", "such", "dir.jsonl")}, nil, nil, epoch); err == nil {
		t.Error("Start on a missing directory: no error")
	}
	sub := filepath.Join(dir, "sub")
	os.Mkdir(sub, 0o755)
	path := filepath.Join(sub, "rec.jsonl")
	r, m := start(t, Config{Path: path})
	r.Add(entry(0, "s", 1))
	wait.For(t, "the first line written", func() bool { return r.Status().Written == 1 })
	os.RemoveAll(sub) // the directory is gone: the reopen cannot create the file
	r.Reopen()
	wait.For(t, "the reopen's failure counted", func() bool { return value(m.errors.WithLabelValues("open")) > 0 })
	r.Add(entry(1, "s", 1)) // no file: opened again, in vain
	r.Stop()
	if st := r.Status(); st.Written != 1 || st.Dropped != 1 || !strings.Contains(st.LastErr, "open") {
		t.Errorf("status %+v: want 1 written, 1 dropped, the last error an open", st)
	}
}

package record

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/internal/wait"
)

// TestSymlinkRefused: a recording whose path is a symbolic link (planted
// in the recordings' directory, pointing at a file the router may write)
// is refused with a clear error, and the file it points to is untouched;
// so is a key file that is a link.
func TestSymlinkRefused(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "precious")
	if err := os.WriteFile(target, []byte("keep me\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "rec.jsonl")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, err := Start(Config{Path: link}, nil, nil, epoch); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("Start on a symlink: %v, want an error saying it is a symbolic link", err)
	}
	if b, _ := os.ReadFile(target); string(b) != "keep me\n" {
		t.Errorf("the link's target holds %q, want it untouched", b)
	}
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(target, []byte("0123456789abcdef0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, key); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadKeyFile(key); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("a key file that is a link: %v, want an error saying it is a symbolic link", err)
	}
}

// TestFIFORefused: a FIFO in the recordings' directory is refused at
// once, as a recording (opened for writing, with no reader) and as a key
// file (opened for reading, with no writer), where a blocking open would
// hang the caller, the admin API among them, until the other end came.
func TestFIFORefused(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "rec.jsonl")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	if _, err := Start(Config{Path: fifo}, nil, nil, epoch); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("Start on a FIFO: %v, want an error saying it is not a regular file", err)
	}
	if _, err := ReadKeyFile(fifo); err == nil || !strings.Contains(err.Error(), "not a regular file (a FIFO)") {
		t.Errorf("a key file that is a FIFO: %v, want an error saying it is a FIFO", err)
	}
}

// TestReopenOntoFIFO: when the recording's path becomes a FIFO between
// two opens (a reopen on SIGHUP), the reopen fails at once instead of
// blocking the writer: the requests are dropped and counted, one error
// is logged, and Stop returns.
func TestReopenOntoFIFO(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rec.jsonl")
	var log bytes.Buffer
	m, _ := NewMetrics(prometheus.NewRegistry())
	r, err := Start(Config{Path: path, Queue: 16}, m, slog.New(slog.NewTextHandler(&log, nil)), epoch)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	r.Reopen()
	wait.For(t, "the reopen failed", func() bool { return r.Status().Errors > 0 })
	for i := range 10 {
		r.Add(entry(i, "s", 1, 2))
	}
	r.Stop()
	st := r.Status()
	if st.Written != 0 || st.Dropped != 10 || st.Errors == 0 || !strings.Contains(st.LastErr, "not a regular file") {
		t.Errorf("status %+v: want 0 written, 10 dropped, errors, the last one not a regular file", st)
	}
	if got := value(m.dropped.WithLabelValues("write_error")); got != 10 {
		t.Errorf("kvrouter_record_dropped_total{reason=write_error} %v, want 10", got)
	}
	if n := strings.Count(log.String(), "level=ERROR"); n != 1 {
		t.Errorf("%d error lines in %q, want 1 per failure spell", n, log.String())
	}
}

// TestBounds: max_bytes and backups are bounded: a rotation size of one
// byte and 100,000,000 backups (which stalled the writer) are refused.
func TestBounds(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{MaxBytes: 1}, "record-max-bytes"},
		{Config{MaxBytes: MaxMaxBytes + 1}, "record-max-bytes"},
		{Config{Backups: 100_000_000}, "record-backups"},
		{Config{Backups: -1}, "record-backups"},
	} {
		if err := c.cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error about %s", c.cfg, err, c.want)
		}
	}
	if err := (Config{MaxBytes: MinMaxBytes, Backups: MaxBackups}).Validate(); err != nil {
		t.Errorf("the bounds themselves: %v, want valid", err)
	}
}

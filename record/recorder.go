package record

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of Config.
const (
	DefaultMaxBytes = 256 << 20
	DefaultBackups  = 5
	DefaultQueue    = 4096
)

// Bounds of Config.
const (
	// MinMaxBytes is the smallest rotation size, a page: a recording line
	// is a few hundred bytes, so a file takes tens of lines before it is
	// rotated (a size of 1 rotated on every line).
	MinMaxBytes = 4 << 10
	// MaxMaxBytes is the largest: 1 TiB, past any disk a router writes.
	MaxMaxBytes = 1 << 40
	// MaxBackups bounds the files kept: a rotation renames each of them,
	// so it costs at most 100 renames (100,000,000 stalled the writer).
	MaxBackups = 100
)

// maxBatch is how many queued entries one write takes.
const maxBatch = 256

// Config configures a recording (kvrouter serve --record and its
// siblings). The zero value records nothing: Path is required to Start.
type Config struct {
	// Path is the file the recording is appended to; empty means no
	// recording.
	Path string `yaml:"record"`
	// MaxBytes is the size at which the file is rotated (renamed Path.1,
	// the older ones shifted to Path.2 ...); zero means DefaultMaxBytes.
	MaxBytes int64 `yaml:"record-max-bytes"`
	// Backups is how many rotated files are kept; zero means
	// DefaultBackups.
	Backups int `yaml:"record-backups"`
	// SampleRate is the fraction of sessions recorded, 0..1, chosen by a
	// keyed hash of the session id, so that a conversation is recorded
	// whole or not at all; zero means 1 (everything).
	SampleRate float64 `yaml:"record-sample-rate"`
	// KeyFile holds the secret the ids are keyed with (at least 16
	// bytes); empty means a random secret per recording, so that no two
	// recordings share an id.
	KeyFile string `yaml:"record-key-file"`
	// Queue bounds the requests waiting to be written; past it they are
	// dropped and counted. Zero means DefaultQueue.
	Queue int `yaml:"record-queue"`
}

// Validate checks the bounds of c.
func (c Config) Validate() error {
	var errs []error
	if c.MaxBytes != 0 && (c.MaxBytes < MinMaxBytes || c.MaxBytes > MaxMaxBytes) {
		errs = append(errs, fmt.Errorf("record-max-bytes: want 0 (%d) or %d..%d, got %d", DefaultMaxBytes, MinMaxBytes, int64(MaxMaxBytes), c.MaxBytes))
	}
	if c.Backups < 0 || c.Backups > MaxBackups {
		errs = append(errs, fmt.Errorf("record-backups: want 0 (%d) up to %d, got %d", DefaultBackups, MaxBackups, c.Backups))
	}
	if !(c.SampleRate >= 0 && c.SampleRate <= 1) {
		errs = append(errs, fmt.Errorf("record-sample-rate: want 0..1, got %v", c.SampleRate))
	}
	if c.Queue < 0 || c.Queue > 1<<20 {
		errs = append(errs, fmt.Errorf("record-queue: want 0..%d, got %d", 1<<20, c.Queue))
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if c.MaxBytes == 0 {
		c.MaxBytes = DefaultMaxBytes
	}
	if c.Backups == 0 {
		c.Backups = DefaultBackups
	}
	if c.SampleRate == 0 {
		c.SampleRate = 1
	}
	if c.Queue == 0 {
		c.Queue = DefaultQueue
	}
	return c
}

// Status is a recording's state, as the admin API shows it.
type Status struct {
	Recording   bool      `json:"recording"`
	Path        string    `json:"path,omitempty"`
	Started     time.Time `json:"started,omitzero"`
	SampleRate  float64   `json:"sample_rate,omitempty"`
	KeyFromFile bool      `json:"key_from_file,omitempty"`
	// Written counts the lines written; Dropped the requests lost (queue
	// full, or a failed write); Errors the failed opens, writes and
	// rotations.
	Written int64  `json:"written"`
	Dropped int64  `json:"dropped"`
	Errors  int64  `json:"errors"`
	LastErr string `json:"last_error,omitempty"`
}

// Recorder writes one recording. Add is safe for concurrent use and never
// blocks; one goroutine, started by Start and ended by Stop, does the
// writing.
type Recorder struct {
	cfg     Config
	keys    *Keys
	fromKey bool
	start   time.Time
	m       *Metrics
	log     *slog.Logger
	q       chan *Entry
	reopen  chan struct{}
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once

	written, dropped, errs atomic.Int64
	lastErr                atomic.Pointer[string]
}

// Start opens cfg.Path (creating it, appending to what it holds) and
// starts the recording's writer; start is time zero of its timestamps.
// It fails when the file cannot be opened or the key file read. m may be
// nil (no metrics); log nil discards.
func Start(cfg Config, m *Metrics, log *slog.Logger, start time.Time) (*Recorder, error) {
	if cfg.Path == "" {
		return nil, errors.New("record: no file given")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	var secret []byte
	if cfg.KeyFile != "" {
		var err error
		if secret, err = ReadKeyFile(cfg.KeyFile); err != nil {
			return nil, err
		}
	}
	keys, err := NewKeys(secret)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if m == nil {
		m, _ = NewMetrics(nil) // unregistered: cannot fail
	}
	f := &file{path: cfg.Path, maxBytes: cfg.MaxBytes, backups: cfg.Backups}
	if err := f.open(); err != nil {
		return nil, fmt.Errorf("record: %w", err)
	}
	r := &Recorder{cfg: cfg, keys: keys, fromKey: secret != nil, start: start, m: m, log: log,
		q: make(chan *Entry, cfg.Queue), reopen: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	m.recording.Set(1)
	go r.run(f)
	return r, nil
}

// Sampled reports whether the requests of session are recorded.
func (r *Recorder) Sampled(session string) bool { return r.keys.Sampled(session, r.cfg.SampleRate) }

// Add queues e to be written, or drops it (counted) when the queue is
// full or the recorder stopped (a request that ended as the recording
// did). It never blocks.
func (r *Recorder) Add(e *Entry) {
	select {
	case <-r.stop:
		r.drop("stopped", 1)
		return
	default:
	}
	select {
	case r.q <- e:
	default:
		r.drop("queue_full", 1)
	}
}

// Reopen closes the file and opens Path again (after an external
// rotation moved it: SIGHUP).
func (r *Recorder) Reopen() {
	select {
	case r.reopen <- struct{}{}:
	default: // one is pending already
	}
}

// Stop writes what is queued, closes the file and waits for the writer.
// Later calls do nothing.
func (r *Recorder) Stop() {
	r.once.Do(func() { close(r.stop) })
	<-r.done
}

// Status returns the recording's state.
func (r *Recorder) Status() Status {
	s := Status{Recording: true, Path: r.cfg.Path, Started: r.start, SampleRate: r.cfg.SampleRate, KeyFromFile: r.fromKey,
		Written: r.written.Load(), Dropped: r.dropped.Load(), Errors: r.errs.Load()}
	select {
	case <-r.done:
		s.Recording = false
	default:
	}
	if e := r.lastErr.Load(); e != nil {
		s.LastErr = *e
	}
	return s
}

func (r *Recorder) drop(reason string, n int) {
	r.dropped.Add(int64(n))
	r.m.dropped.WithLabelValues(reason).Add(float64(n))
}

// run is the writer: it takes the queue in batches and writes each with
// one write, until Stop.
func (r *Recorder) run(f *file) {
	defer close(r.done)
	defer r.m.recording.Set(0)
	w := writer{r: r, f: f}
	batch := make([]*Entry, 0, maxBatch)
	for {
		select {
		case e := <-r.q:
			batch = r.fill(append(batch[:0], e))
			w.write(batch)
		case <-r.reopen:
			w.reopen()
		case <-r.stop:
			for len(r.q) > 0 {
				w.write(r.fill(batch[:0]))
			}
			if err := f.close(); err != nil {
				w.fail("close", err)
			}
			return
		}
	}
}

// fill appends to batch what is queued, up to maxBatch entries.
func (r *Recorder) fill(batch []*Entry) []*Entry {
	for len(batch) < maxBatch {
		select {
		case e := <-r.q:
			batch = append(batch, e)
		default:
			return batch
		}
	}
	return batch
}

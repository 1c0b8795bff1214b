package peers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/prefix"
)

// Session bindings read-your-writes. The stream carries a router's
// bindings to the others within about 2 × Interval; a conversation's next
// turn may come sooner (an agent loop sends it as soon as the previous
// answer ends), to another router. So a router also writes each binding
// it makes to {prefix}:session:{key} (the replica's id, expiring after
// the session TTL) as soon as it decides, before the answer ends, and a
// router reads that key before deciding on a session request, waiting at
// most ReadTimeout, and takes the binding when it is newer than its own
// (fleet.Fleet.BindPeer: the session, and the blocks of the prompt it was
// bound with on that replica): a turn that reaches router B right after
// router A answered the previous one goes where A sent it.

// DefaultReadTimeout is the longest a request waits for Redis on a
// session it does not know, when Config.ReadTimeout is zero: a loopback
// GET takes about 0.1 ms, one across a zone a few ms.
const DefaultReadTimeout = 5 * time.Millisecond

// sessionMetrics count the request path's reads and writes.
type sessionMetrics struct {
	reads  *prometheus.CounterVec // result: hit, miss, timeout, error
	writes *prometheus.CounterVec // result: ok, error
	read   prometheus.Histogram
}

func newSessionMetrics(reg prometheus.Registerer) (*sessionMetrics, error) {
	m := &sessionMetrics{
		reads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_shared_session_reads_total",
			Help: "Reads of a session binding from Redis on the request path, before deciding a request with a session, by result: hit, miss, timeout (past --shared-read-timeout), error (unreadable or not sealed with --redis-key-file's secret).",
		}, []string{"result"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_shared_session_writes_total",
			Help: "Session bindings written to Redis as they were made, off the request path, by result: ok, error, dropped (more queued than the writer keeps).",
		}, []string{"result"}),
		read: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvrouter_shared_session_read_seconds",
			Help:    "Time a request with a session waited for Redis to read its binding.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025},
		}),
	}
	for _, r := range []string{"hit", "miss", "timeout", "error"} {
		m.reads.WithLabelValues(r)
	}
	for _, r := range []string{"ok", "error", "dropped"} {
		m.writes.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.reads, m.writes, m.read} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (k keys) session(key string) string { return k.prefix + ":session:" + key }

// ReadSession returns the binding Redis holds for session key, or false:
// unknown there, or no answer within Config.ReadTimeout (counted by result
// in kvrouter_shared_session_reads_total).
func (s *Syncer) ReadSession(ctx context.Context, key string) (fleet.PeerSession, bool) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ReadTimeout)
	defer cancel()
	start := time.Now()
	k := s.keys.session(key)
	v, err := s.fast.GetRange(ctx, k, 0, maxSessionBytes).Result()
	s.sm.read.Observe(time.Since(start).Seconds())
	switch {
	case err == nil && v == "": // GETRANGE answers "" for a missing key
		s.sm.reads.WithLabelValues("miss").Inc()
	case err == nil:
		if p, ok := s.openSession(k, v); ok {
			s.sm.reads.WithLabelValues("hit").Inc()
			return p, true
		}
		s.sm.reads.WithLabelValues("error").Inc()
	case errors.Is(err, redis.Nil):
		s.sm.reads.WithLabelValues("miss").Inc()
	case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || isTimeout(err):
		s.sm.reads.WithLabelValues("timeout").Inc()
	default:
		s.sm.reads.WithLabelValues("error").Inc()
	}
	return fleet.PeerSession{}, false
}

// Bounds of the session writer.
const (
	// maxQueuedWrites is the most bindings waiting for the writer; past
	// it a binding is not written (the stream still carries it a round
	// later), counted as result "dropped".
	maxQueuedWrites = 4096
	// maxWriteBatch is the most bindings one pipeline writes.
	maxWriteBatch = 256
)

// sessionWrite is one binding waiting for the writer.
type sessionWrite struct {
	key, value string
	ttl        time.Duration
	done       chan struct{}
}

// WriteSession queues session key's binding p, expiring after ttl, for
// the writer (writeSessions, off the request path), and returns a channel
// closed once it is written, failed (bounded by Config.Timeout) or was
// dropped (more than maxQueuedWrites waiting), each counted in
// kvrouter_shared_session_writes_total. A caller that wants the next turn
// at another router to find the binding waits for it, but no longer than
// WriteWait.
func (s *Syncer) WriteSession(key string, p fleet.PeerSession, ttl time.Duration) <-chan struct{} {
	k := s.keys.session(key)
	w := sessionWrite{key: k, value: s.seal.seal(k, s.cfg.Router, formatSession(p)), ttl: ttl, done: make(chan struct{})}
	select {
	case s.writes <- w:
	default:
		s.sm.writes.WithLabelValues("dropped").Inc()
		close(w.done)
	}
	return w.done
}

// WriteWait is the longest a request should wait for its binding's write
// (Settings.ReadTimeout, the bound of the read too): the write goes on
// after it, off the request path.
func (s *Syncer) WriteWait() time.Duration { return s.cfg.ReadTimeout }

// writeSessions writes the queued bindings, in order, a pipeline at a
// time, until ctx is done; the bindings still queued then are dropped.
func (s *Syncer) writeSessions(ctx context.Context) {
	batch := make([]sessionWrite, 0, maxWriteBatch)
	for {
		select {
		case <-ctx.Done():
			s.dropQueued()
			return
		case w := <-s.writes:
			batch = append(batch[:0], w)
		}
	fill:
		for len(batch) < maxWriteBatch {
			select {
			case w := <-s.writes:
				batch = append(batch, w)
			default:
				break fill
			}
		}
		s.writeBatch(ctx, batch)
	}
}

// writeBatch writes batch in one pipeline bounded by Config.Timeout.
func (s *Syncer) writeBatch(ctx context.Context, batch []sessionWrite) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	pipe := s.fast.Pipeline()
	for _, w := range batch {
		pipe.Set(ctx, w.key, w.value, w.ttl)
	}
	cmds, _ := pipe.Exec(ctx)
	for i, w := range batch {
		result := "error"
		if i < len(cmds) && cmds[i].Err() == nil {
			result = "ok"
		}
		s.sm.writes.WithLabelValues(result).Inc()
		close(w.done)
	}
}

// dropQueued releases the bindings still queued when the writer stops.
func (s *Syncer) dropQueued() {
	for {
		select {
		case w := <-s.writes:
			s.sm.writes.WithLabelValues("dropped").Inc()
			close(w.done)
		default:
			return
		}
	}
}

// maxSessionBytes is the most of a binding's value read: its time, blocks
// and tail (60 bytes at most), a router id (128) and a replica URL, with
// the seal's 72 bytes and a second router id.
const maxSessionBytes = 4 << 10

// openSession checks and parses the value v of session key k, counting a
// value too large, unsealed or malformed.
func (s *Syncer) openSession(k, v string) (fleet.PeerSession, bool) {
	if len(v) > maxSessionBytes {
		s.m.decodeErrors.Inc()
		return fleet.PeerSession{}, false
	}
	payload, _, ok := s.seal.open(k, v)
	if !ok {
		s.m.reject(KindSession)
		return fleet.PeerSession{}, false
	}
	p, ok := parseSession(payload)
	if !ok {
		s.m.decodeErrors.Inc()
	}
	return p, ok
}

// formatSession is a binding's value in Redis: the bind time in Unix
// nanoseconds, the prompt's blocks, its last block's hash, the router
// that bound it and the replica, space-separated (the replica last: a
// URL has no space; a router id has none either).
func formatSession(p fleet.PeerSession) string {
	return fmt.Sprintf("%d %d %d %s %s", p.At.UnixNano(), p.Blocks, uint64(p.Tail), cmp.Or(p.Router, "-"), p.Replica)
}

// parseSession parses formatSession's value ("-": no router), or the
// value an earlier kvrouter wrote (no router field), so that a fleet of
// routers can be upgraded one by one.
func parseSession(v string) (fleet.PeerSession, bool) {
	f := strings.SplitN(v, " ", 5)
	if len(f) == 4 && !strings.Contains(f[3], " ") {
		f = []string{f[0], f[1], f[2], "-", f[3]}
	}
	if len(v) > maxSessionBytes || len(f) != 5 || f[3] == "" || f[4] == "" {
		return fleet.PeerSession{}, false
	}
	at, err1 := strconv.ParseInt(f[0], 10, 64)
	blocks, err2 := strconv.Atoi(f[1])
	tail, err3 := strconv.ParseUint(f[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || blocks < 0 {
		return fleet.PeerSession{}, false
	}
	router := f[3]
	if router == "-" {
		router = ""
	}
	return fleet.PeerSession{Replica: f[4], Router: router, At: time.Unix(0, at), Blocks: blocks, Tail: prefix.Hash(tail)}, true
}

// isTimeout reports a network timeout.
func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

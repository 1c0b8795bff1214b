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
			Help: "Reads of a session binding from Redis on the request path, before deciding a request with a session, by result: hit, miss, timeout (past --shared-read-timeout), error.",
		}, []string{"result"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_shared_session_writes_total",
			Help: "Session bindings written to Redis as they were made, by result: ok, error.",
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
	m.writes.WithLabelValues("ok")
	m.writes.WithLabelValues("error")
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
	v, err := s.fast.Get(ctx, s.keys.session(key)).Result()
	s.sm.read.Observe(time.Since(start).Seconds())
	switch {
	case err == nil:
		if p, ok := parseSession(v); ok {
			s.sm.reads.WithLabelValues("hit").Inc()
			return p, true
		}
		s.m.decodeErrors.Inc()
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

// WriteSession writes session key's binding p, expiring after ttl, in the
// background, and returns a channel closed when the write is done (or
// failed, counted in kvrouter_shared_session_writes_total): the caller
// waits for it before its answer ends. The write is bounded by
// Config.Timeout.
func (s *Syncer) WriteSession(key string, p fleet.PeerSession, ttl time.Duration) <-chan struct{} {
	done := make(chan struct{})
	v := formatSession(p)
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
		defer cancel()
		result := "ok"
		if err := s.fast.Set(ctx, s.keys.session(key), v, ttl).Err(); err != nil {
			result = "error"
		}
		s.sm.writes.WithLabelValues(result).Inc()
	}()
	return done
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
	if len(v) > maxMemberBytes || len(f) != 5 || f[3] == "" || f[4] == "" {
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

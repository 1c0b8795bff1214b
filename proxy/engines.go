package proxy

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/hashing"
)

// engineOf names the engine of the replica at base: its backend's
// engine= option, else the one its last /metrics page showed, else "".
func (st *state) engineOf(base string) string {
	for _, b := range st.bes.list() {
		if b.cfg.URL == base && b.cfg.Engine != "" {
			return b.cfg.Engine
		}
	}
	if st.scraper != nil {
		if s, ok := st.scraper.Status(base); ok {
			return s.Last.Engine
		}
	}
	return ""
}

// onUnknownMetrics logs, once per replica, a /metrics page with no family
// the router reads: the replica's load reads as idle and its seats as the
// preset's, so it is routed to as if it were always free.
func (st *state) onUnknownMetrics(id string) {
	st.log.Warn("replica metrics have no family the router reads (vllm:, sglang:, llamacpp:): its load reads as idle; "+
		"start llama-server with --metrics, or check the backend is an engine", "replica", id)
}

// fallbackLogEvery is the least time between two log lines of tokenizer
// fallbacks; those between are counted into the next line.
const fallbackLogEvery = 10 * time.Second

// fallbackLog logs tokenizer failures that send requests to text mode,
// at most one line per fallbackLogEvery.
type fallbackLog struct {
	st *state
	// mu guards last and quiet.
	mu    sync.Mutex
	last  time.Time
	quiet int
}

// note logs err, or counts it when a line was logged lately.
func (l *fallbackLog) note(err error) {
	l.mu.Lock()
	now := time.Now()
	if !l.last.IsZero() && now.Sub(l.last) < fallbackLogEvery {
		l.quiet++
		l.mu.Unlock()
		return
	}
	quiet := l.quiet
	l.last, l.quiet = now, 0
	l.mu.Unlock()
	l.st.log.Warn("tokenizer failed: request hashed in text mode", "err", err, "more_since_last_line", quiet)
}

// newTokenizeCollector exports the hasher's token-mode fallbacks.
func newTokenizeCollector(h *hashing.Hasher) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "kvrouter_tokenize_fallbacks_total",
		Help: "Requests hashed in text mode because their tokenizer failed (a replica's /tokenize erred, or answered no token for a non-empty prompt), in token mode.",
	}, func() float64 { return float64(h.Stats().Fails) })
}

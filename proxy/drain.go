package proxy

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/sse"
)

// cutWriteTimeout bounds the write of the event that ends a request at
// the end of a drain, so that a client that does not read cannot hold the
// shutdown.
const cutWriteTimeout = 2 * time.Second

// liveSet tracks the API requests in flight so that a drain can count
// them and, at its deadline, end them. mu guards live.
type liveSet struct {
	draining atomic.Bool
	gate     atomic.Pointer[func() string] // SetReadyGate's; nil: none
	mu       sync.Mutex
	live     map[*tracked]struct{}
}

// tracked is the response writer of one request in flight. Its mutex
// serialises the handler's writes with the one write of a drain's end:
// mu guards every field but w and cancel, and the writes to w.
type tracked struct {
	w      http.ResponseWriter
	cancel context.CancelFunc // ends the request's context: its upstream attempt

	mu    sync.Mutex
	wrote bool    // a final status was written
	sse   bool    // the response is an event stream
	tail  [3]byte // the last body bytes written, to close a partial event
	n     int     // body bytes written, up to len(tail)
	cut   bool    // the drain ended the request: the handler's writes go nowhere
	early bool    // cut before any status: answered 503 when the handler returns
	why   string  // the cut's reason, for that 503
	done  bool    // the handler returned
}

// track wraps next so that every request is counted in flight and can be
// ended by cut.
func (f *liveSet) track(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancel(r.Context())
		t := &tracked{w: w, cancel: cancel}
		f.mu.Lock()
		if f.live == nil {
			f.live = map[*tracked]struct{}{}
		}
		f.live[t] = struct{}{}
		f.mu.Unlock()
		defer func() {
			f.mu.Lock()
			delete(f.live, t)
			f.mu.Unlock()
			cancel()
		}()
		defer t.finish()
		next.ServeHTTP(t, r.WithContext(ctx))
	})
}

// count returns the number of requests in flight.
func (f *liveSet) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.live)
}

// cut ends every request in flight: a stream gets a final SSE error event
// (OpenAI's error object, code server_shutting_down), a request not yet
// answered gets 503, and each one's upstream attempt is canceled. It
// returns how many it ended, once their events are written (each within
// cutWriteTimeout).
func (f *liveSet) cut(why string) int {
	f.mu.Lock()
	all := make([]*tracked, 0, len(f.live))
	for t := range f.live {
		all = append(all, t)
	}
	f.mu.Unlock()
	event := sse.AppendError(nil, errUnavailable, codeShuttingDown, why)
	var n atomic.Int64
	var wg sync.WaitGroup
	for _, t := range all {
		wg.Go(func() {
			if t.end(event, why) {
				n.Add(1)
			}
		})
	}
	wg.Wait()
	return int(n.Load())
}

// end ends t's request with event (a stream) or, through finish, a 503
// carrying why. It reports false when the request had already ended.
func (t *tracked) end(event []byte, why string) bool {
	rc := http.NewResponseController(t.w)
	rc.SetWriteDeadline(time.Now().Add(cutWriteTimeout)) // also frees a handler stuck writing
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cut || t.done {
		return false
	}
	t.cut = true
	switch {
	case !t.wrote:
		t.early, t.why = true, why
	case t.sse:
		if t.n > 0 && !sse.Closed(t.tail[3-t.n:]) {
			t.w.Write(sse.EventEnd)
		}
		t.w.Write(event)
		rc.Flush()
	}
	t.cancel()
	return true
}

// finish runs when the handler returns: a request cut before it had an
// answer gets its 503 now, when no other goroutine writes.
func (t *tracked) finish() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.done = true
	if !t.early {
		return
	}
	h := t.w.Header()
	for k := range h {
		delete(h, k)
	}
	h.Set("Retry-After", "1")
	h.Set("Connection", "close")
	writeError(t.w, http.StatusServiceUnavailable, errUnavailable, codeShuttingDown, t.why)
}

// Header implements http.ResponseWriter.
func (t *tracked) Header() http.Header { return t.w.Header() }

// WriteHeader implements http.ResponseWriter.
func (t *tracked) WriteHeader(status int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cut {
		return
	}
	t.writeHeaderLocked(status)
}

func (t *tracked) writeHeaderLocked(status int) {
	if status >= 200 && !t.wrote {
		t.wrote = true
		ct := t.w.Header().Get("Content-Type")
		t.sse = len(ct) >= 17 && ct[:17] == "text/event-stream"
	}
	t.w.WriteHeader(status)
}

// Write implements http.ResponseWriter. After a cut, writes succeed and
// go nowhere, so that the handler ends as if the stream had.
func (t *tracked) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cut {
		return len(p), nil
	}
	if !t.wrote {
		t.writeHeaderLocked(http.StatusOK)
	}
	n, err := t.w.Write(p)
	t.note(p[:n])
	return n, err
}

// note keeps the last bytes written.
func (t *tracked) note(p []byte) {
	if len(p) >= len(t.tail) {
		copy(t.tail[:], p[len(p)-len(t.tail):])
		t.n = len(t.tail)
		return
	}
	copy(t.tail[:], t.tail[len(p):])
	copy(t.tail[len(t.tail)-len(p):], p)
	t.n = min(t.n+len(p), len(t.tail))
}

// FlushError implements the flush http.ResponseController calls.
func (t *tracked) FlushError() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cut {
		return nil
	}
	return flush(t.w)
}

// flush flushes w without allocating (the server's writer flushes
// itself; others go through http.ResponseController).
func flush(w http.ResponseWriter) error {
	switch f := w.(type) {
	case interface{ FlushError() error }:
		return f.FlushError()
	case http.Flusher:
		f.Flush()
		return nil
	}
	return http.NewResponseController(w).Flush()
}

// Unwrap returns the server's ResponseWriter, for http.ResponseController.
func (t *tracked) Unwrap() http.ResponseWriter { return t.w }

// Drain marks the router unready: /readyz answers 503 from now on, while
// the requests in flight go on. The caller stops accepting connections
// (http.Server.Shutdown) and, at its deadline, calls CutInFlight.
func (rt *Router) Drain() {
	rt.live.draining.Store(true)
	rt.m.draining.Set(1)
}

// InFlight returns the number of API requests in flight.
func (rt *Router) InFlight() int { return rt.live.count() }

// CutInFlight ends every API request in flight, telling the client why:
// streams get a final SSE error event, requests not yet answered a 503.
// It returns how many it ended; each is counted in kvrouter_errors_total
// as server_shutting_down.
func (rt *Router) CutInFlight(why string) int {
	n := rt.live.cut(why)
	rt.m.errors.WithLabelValues(codeShuttingDown).Add(float64(n))
	return n
}

// serveLive answers 200 while the process runs (liveness).
func (rt *Router) serveLive(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Write([]byte("ok\n"))
}

// SetReadyGate makes readiness (/readyz, on the API and the admin
// listener) ask gate too: a non-empty answer is why this router must not
// take traffic (an endpoint picker following a leader election answers
// so while another leads), and /readyz is 503 not_ready with it.
func (rt *Router) SetReadyGate(gate func() string) { rt.live.gate.Store(&gate) }

// serveReady answers 200 when the router takes new requests: it is not
// draining, its ready gate (SetReadyGate) lets it, and at least one
// replica is healthy; else 503 (readiness).
func (rt *Router) serveReady(w http.ResponseWriter, r *http.Request) {
	if rt.live.draining.Load() {
		writeError(w, http.StatusServiceUnavailable, errUnavailable, "draining", "the router is shutting down")
		return
	}
	if g := rt.live.gate.Load(); g != nil {
		if why := (*g)(); why != "" {
			writeError(w, http.StatusServiceUnavailable, errUnavailable, "not_ready", why)
			return
		}
	}
	rt.serveHealth(w, r)
}

var (
	_ http.ResponseWriter             = (*tracked)(nil)
	_ interface{ FlushError() error } = (*tracked)(nil)
)

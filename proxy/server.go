package proxy

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// NewServer returns the http.Server for Handler with the client-side
// limits of the configuration: MaxHeaderBytes, ReadHeaderTimeout and
// IdleTimeout as the server enforces them, the header-count limit (431)
// and the body timeout (408) in a wrapper around the handler. There is no
// ReadTimeout or WriteTimeout: they would cut long streams. Serve it on a
// listener of the caller's (its Addr is Config.Listen).
func (rt *Router) NewServer() *http.Server {
	return rt.server(rt.cfg.Listen, rt.Handler())
}

// NewAdminServer is NewServer for AdminHandler on AdminListen: the same
// limits and timeouts.
func (rt *Router) NewAdminServer() *http.Server {
	return rt.server(rt.cfg.AdminListen, rt.AdminHandler())
}

// server returns an http.Server for h on addr with the client limits.
func (rt *Router) server(addr string, h http.Handler) *http.Server {
	c := &rt.cfg
	conns := &connWatch{rejected: rt.m.headerRejected}
	h2 := &h2Idle{limit: cmp.Or(c.ReadHeaderTimeout, DefaultReadHeaderTimeout)}
	return &http.Server{
		Addr:              addr,
		Handler:           rt.guard(h),
		MaxHeaderBytes:    cmp.Or(c.MaxHeaderBytes, DefaultMaxHeaderBytes),
		ReadHeaderTimeout: cmp.Or(c.ReadHeaderTimeout, DefaultReadHeaderTimeout),
		IdleTimeout:       cmp.Or(c.IdleTimeout, DefaultIdleTimeout),
		ConnContext:       conns.context,
		ConnState:         func(nc net.Conn, s http.ConnState) { conns.state(nc, s); h2.state(nc, s) },
		ErrorLog:          slog.NewLogLogger(rt.log.Handler(), slog.LevelDebug),
	}
}

// bodyTimeout is BodyTimeout, or its default.
func (c *Config) bodyTimeout() time.Duration { return cmp.Or(c.BodyTimeout, DefaultBodyTimeout) }

// guard wraps h with the per-request client limits: a request with more
// than MaxHeaders header fields is answered 431 too_many_headers, and a
// request body must arrive within BodyTimeout of the handler's start (a
// read deadline on the connection, lifted once the body is read, so that
// the response may stream for as long as it lasts).
func (rt *Router) guard(h http.Handler) http.Handler {
	maxHeaders := cmp.Or(rt.cfg.MaxHeaders, DefaultMaxHeaders)
	bodyTimeout := rt.cfg.bodyTimeout()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served(r.Context())
		if n := headerFields(r.Header); n > maxHeaders {
			rt.m.errors.WithLabelValues("too_many_headers").Inc()
			w.Header().Set("Connection", "close")
			writeError(w, http.StatusRequestHeaderFieldsTooLarge, errInvalidRequest, "too_many_headers",
				fmt.Sprintf("request has %d header fields, more than the router's limit of %d", n, maxHeaders))
			return
		}
		if r.Body != nil && r.Body != http.NoBody {
			rc := http.NewResponseController(w)
			// A wall-clock deadline, whatever clock the router decides on.
			if rc.SetReadDeadline(time.Now().Add(bodyTimeout)) == nil {
				r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc}
			}
		}
		h.ServeHTTP(w, r)
	})
}

// headerFields counts the header fields of h (each value of a repeated
// field counts once).
func headerFields(h http.Header) int {
	n := 0
	for _, v := range h {
		n += len(v)
	}
	return n
}

// deadlineBody is a request body read under a connection read deadline,
// which it lifts when the body ends: past that point the server reads the
// connection only to notice the client leaving, which must not time out
// a response still streaming.
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

// Read implements io.Reader.
func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// connWatch counts the connections the server closes while reading a
// request header, before any handler runs: a header larger than
// MaxHeaderBytes (net/http answers 431 itself), a malformed request (400)
// or a header not complete within ReadHeaderTimeout. A connection is
// marked when request bytes arrive (http.StateActive) and unmarked when
// the request reaches the handler; one closed while marked is counted.
type connWatch struct {
	rejected interface{ Inc() }
	// mu guards pending.
	mu      sync.Mutex
	pending map[net.Conn]*atomic.Bool
}

type connKey struct{}

// context gives c's requests their connection's mark (ConnContext).
func (cw *connWatch) context(ctx context.Context, c net.Conn) context.Context {
	mark := new(atomic.Bool)
	cw.mu.Lock()
	if cw.pending == nil {
		cw.pending = make(map[net.Conn]*atomic.Bool)
	}
	cw.pending[c] = mark
	cw.mu.Unlock()
	return context.WithValue(ctx, connKey{}, mark)
}

// state follows c's state (ConnState).
func (cw *connWatch) state(c net.Conn, s http.ConnState) {
	switch s {
	case http.StateActive:
		cw.mu.Lock()
		mark := cw.pending[c]
		cw.mu.Unlock()
		if mark != nil {
			mark.Store(true)
		}
	case http.StateClosed, http.StateHijacked:
		cw.mu.Lock()
		mark := cw.pending[c]
		delete(cw.pending, c)
		cw.mu.Unlock()
		if mark != nil && mark.Load() && s == http.StateClosed {
			cw.rejected.Inc()
		}
	}
}

// served unmarks the connection of a request that reached the handler.
func served(ctx context.Context) {
	if mark, ok := ctx.Value(connKey{}).(*atomic.Bool); ok {
		mark.Store(false)
	}
}

var _ io.ReadCloser = (*deadlineBody)(nil)

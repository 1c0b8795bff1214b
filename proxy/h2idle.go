package proxy

import (
	"crypto/tls"
	"net"
	"net/http"
	"sync"
	"time"
)

// h2Idle closes an HTTP/2 connection that has no stream open for limit
// (Config.ReadHeaderTimeout). net/http's HTTP/2 server bounds a header
// block with nothing but its idle timeout: a client that starts a request's
// HEADERS and never sends their end holds the connection for
// Config.IdleTimeout (90 s), not the header timeout, since no stream opens
// until the block ends, and HTTP/2 cannot tell it from an idle connection.
// So an HTTP/2 connection idle for the header timeout is closed; clients
// reconnect for their next request. HTTP/1 connections are left to the
// server's own timeouts.
type h2Idle struct {
	limit time.Duration
	// mu guards timers.
	mu     sync.Mutex
	timers map[net.Conn]*time.Timer
}

// state follows c's state (http.Server.ConnState): an HTTP/2 connection
// going idle starts its timer, one going active or closed stops it.
func (h *h2Idle) state(c net.Conn, s http.ConnState) {
	if h == nil || h.limit <= 0 {
		return
	}
	switch s {
	case http.StateIdle:
		if tc, ok := c.(*tls.Conn); ok && tc.ConnectionState().NegotiatedProtocol == "h2" {
			h.arm(c)
		}
	case http.StateActive, http.StateClosed, http.StateHijacked:
		h.disarm(c)
	}
}

func (h *h2Idle) arm(c net.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if t := h.timers[c]; t != nil {
		t.Reset(h.limit)
		return
	}
	if h.timers == nil {
		h.timers = make(map[net.Conn]*time.Timer)
	}
	h.timers[c] = time.AfterFunc(h.limit, func() { c.Close() })
}

func (h *h2Idle) disarm(c net.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if t := h.timers[c]; t != nil {
		t.Stop()
		delete(h.timers, c)
	}
}

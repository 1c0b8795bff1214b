package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// connect owns replica g's SUB socket in connect mode: it dials the
// engine's PUB endpoint, forwards messages to g in order, and on a lost
// connection tells g (continuity is then unknown) and dials again, with
// doubling backoff. It reconnects in its own loop rather than with zmq4's
// WithAutomaticReconnect, which races with Close.
func (s *Subscriber) connect(ctx context.Context, g *ingester) {
	backoff := s.cfg.MinBackoff
	for ctx.Err() == nil {
		if s.session(ctx, g) {
			backoff = s.cfg.MinBackoff
		} else {
			backoff = min(2*backoff, s.cfg.MaxBackoff)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// session dials once and reads until the connection or ctx ends; it
// reports whether the dial succeeded.
func (s *Subscriber) session(ctx context.Context, g *ingester) bool {
	sub := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(s.cfg.ReplayTimeout))
	defer sub.Close()
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return false
	}
	if err := sub.Dial(g.rep.Endpoint); err != nil {
		g.log.Debug("kv events: dial", "endpoint", g.rep.Endpoint, "err", err)
		return false
	}
	g.c.connected.Store(true)
	g.log.Info("kv events: connected", "endpoint", g.rep.Endpoint)
	defer func() {
		g.c.connected.Store(false)
		select {
		case g.in <- message{lost: true}:
		case <-ctx.Done():
		}
	}()
	for {
		m, err := sub.Recv()
		if err != nil {
			if ctx.Err() == nil {
				g.log.Warn("kv events: connection lost", "endpoint", g.rep.Endpoint, "err", err)
			}
			return true
		}
		msg, ok := parseMsg(m)
		if !ok {
			g.c.decodeErrors.Add(1)
			continue
		}
		select {
		case g.in <- msg:
		case <-ctx.Done():
			return true
		}
	}
}

// parseMsg reads a live message [topic, seq (8 bytes big-endian), payload].
func parseMsg(m zmq4.Msg) (message, bool) {
	if len(m.Frames) != 3 || len(m.Frames[1]) != 8 {
		return message{}, false
	}
	return message{
		topic:   string(m.Frames[0]),
		seq:     binary.BigEndian.Uint64(m.Frames[1]),
		payload: m.Frames[2],
		at:      time.Now(),
	}, true
}

// listener is the bind-mode SUB socket engines dial into.
type listener struct {
	sub       zmq4.Socket
	addr      string // dialable endpoint
	dispatch  func(message) bool
	unmatched atomic.Uint64
}

func listen(ctx context.Context, endpoint string, dispatch func(message) bool) (*listener, error) {
	sub := zmq4.NewSub(ctx)
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		sub.Close()
		return nil, fmt.Errorf("kvevents: subscribe: %w", err)
	}
	if err := sub.Listen(endpoint); err != nil {
		sub.Close()
		return nil, fmt.Errorf("kvevents: bind %s: %w", endpoint, err)
	}
	return &listener{sub: sub, addr: dialable(endpoint, sub.Addr()), dispatch: dispatch}, nil
}

// run reads the bound socket until ctx ends. Errors from one engine's
// connection (it went away) do not stop it.
func (l *listener) run(ctx context.Context) {
	for ctx.Err() == nil {
		m, err := l.sub.Recv()
		if err != nil {
			continue
		}
		msg, ok := parseMsg(m)
		if !ok || !l.dispatch(msg) {
			l.unmatched.Add(1)
		}
	}
}

func (l *listener) close() { l.sub.Close() }

// dialable turns a bound endpoint into one a local peer can dial.
func dialable(endpoint string, addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || !strings.HasPrefix(endpoint, "tcp://") {
		return endpoint
	}
	host := "127.0.0.1"
	if !tcp.IP.IsUnspecified() {
		host = tcp.IP.String()
	}
	return "tcp://" + net.JoinHostPort(host, fmt.Sprint(tcp.Port))
}

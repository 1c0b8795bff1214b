package kvevents

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/zmtp"
)

// listener is the bind-mode socket engines dial into. One goroutine
// accepts and only accepts: a peer that is not allowed is closed at once;
// one beyond Config.MaxConns takes the slot of the oldest connection still
// in its handshake (closed), else is closed at once; every other
// connection gets its own goroutine for the handshake (bounded by
// Config.HandshakeTimeout) and its messages, so no peer can hold up
// another's connect, and handshakes held open cannot fill the socket
// against an engine that finishes its own.
type listener struct {
	s         *Subscriber
	ln        net.Listener
	addr      string        // dialable endpoint
	slots     chan struct{} // one per open connection, up to MaxConns
	unmatched atomic.Uint64

	mu    sync.Mutex // guards conns and what they point to
	conns map[net.Conn]*bindConn
}

// bindConn is what the listener knows of an open connection: when it was
// accepted, and whether its handshake finished.
type bindConn struct {
	since  time.Time
	shaken bool
}

func (s *Subscriber) listen(endpoint string) (*listener, error) {
	ln, err := zmtp.Listen(endpoint)
	if err != nil {
		return nil, fmt.Errorf("kvevents: bind %s: %w", endpoint, err)
	}
	return &listener{s: s, ln: ln, addr: zmtp.Dialable(endpoint, ln.Addr()),
		slots: make(chan struct{}, s.cfg.MaxConns), conns: map[net.Conn]*bindConn{}}, nil
}

// run accepts until the listener closes. Accept errors other than a
// closed listener (e.g. out of file descriptors) back off briefly, as
// net/http's Server does.
func (l *listener) run(ctx context.Context) {
	var backoff time.Duration
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			l.s.cfg.Logger.Warn("kv events: accept", "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if l.admit(nc) {
			l.s.wg.Go(func() { l.serve(ctx, nc) })
		}
	}
}

// admit takes a connection slot for nc if its peer may publish at all;
// otherwise it closes nc and counts why.
func (l *listener) admit(nc net.Conn) bool {
	s := l.s
	if ip, ok := remoteIP(nc.RemoteAddr()); ok && !s.peers.allowed(ip) && !s.hostKnown(ip) {
		s.rej.add(s.cfg.Logger, RejectPeer, 1, "kv events: connection from a host that is no backend's; add it to --kv-events-allow if it publishes for one",
			"peer", nc.RemoteAddr().String())
		nc.Close()
		return false
	}
	select {
	case l.slots <- struct{}{}:
	default:
		if l.takeSlot(nc) {
			return true
		}
		s.rej.add(s.cfg.Logger, RejectConns, 1, "kv events: bind socket full; connection refused",
			"peer", nc.RemoteAddr().String(), "max_conns", s.cfg.MaxConns)
		nc.Close()
		return false
	}
	l.mu.Lock()
	l.conns[nc] = &bindConn{since: time.Now()}
	l.mu.Unlock()
	return true
}

// heldHandshake is how long a connection must have been in its handshake
// before a new one may take its slot: an engine's finishes within
// milliseconds, so only handshakes held open lose theirs.
const heldHandshake = 100 * time.Millisecond

// takeSlot gives nc the slot of the oldest connection in its handshake for
// at least heldHandshake, which it closes and counts; it reports false
// when there is none.
func (l *listener) takeSlot(nc net.Conn) bool {
	l.mu.Lock()
	var old net.Conn
	at := time.Now().Add(-heldHandshake)
	for c, bc := range l.conns {
		if !bc.shaken && !bc.since.After(at) {
			old, at = c, bc.since
		}
	}
	if old != nil {
		delete(l.conns, old) // its slot is nc's now: drop frees none
		l.conns[nc] = &bindConn{since: time.Now()}
	}
	l.mu.Unlock()
	if old == nil {
		return false
	}
	old.Close()
	l.s.rej.add(l.s.cfg.Logger, RejectConns, 1, "kv events: bind socket full; the oldest unfinished handshake closed for a new connection",
		"peer", old.RemoteAddr().String(), "new_peer", nc.RemoteAddr().String(), "max_conns", l.s.cfg.MaxConns)
	return true
}

// shaken notes that nc finished its handshake: no new connection takes
// its slot.
func (l *listener) shaken(nc net.Conn) {
	l.mu.Lock()
	if bc := l.conns[nc]; bc != nil {
		bc.shaken = true
	}
	l.mu.Unlock()
}

// serve runs one engine connection: the handshake, then its messages,
// each routed by topic to a replica the peer may publish for. The first
// accepted message binds the connection to its replica; when a bound
// connection ends, its replica's continuity is unknown.
func (l *listener) serve(ctx context.Context, nc net.Conn) {
	s := l.s
	defer l.drop(nc)
	peer := nc.RemoteAddr().String()
	c, err := zmtp.Handshake(nc, zmtp.Sub, s.cfg.limits())
	if err == nil {
		err = c.Subscribe("")
	}
	if err != nil {
		l.ended(err, peer)
		return
	}
	l.shaken(nc)
	ip, hasIP := remoteIP(nc.RemoteAddr())
	var bound *ingester
	defer func() {
		if bound != nil {
			bound.unbind(ctx)
		}
	}()
	for {
		frames, err := c.Recv()
		if err != nil {
			l.ended(err, peer)
			return
		}
		m, ok := parseMsg(frames)
		if !ok {
			s.rej.add(s.cfg.Logger, RejectMalformed, 1, "kv events: message is not [topic, seq, payload]", "peer", peer, "frames", len(frames))
			continue
		}
		g, why := l.route(m.topic, ip, hasIP, bound)
		if g == nil {
			s.rej.add(s.cfg.Logger, why, 1, "kv events: message refused", "peer", peer, "topic", m.topic)
			continue
		}
		if bound == nil {
			bound = g
			g.bind()
		}
		g.offer(m)
	}
}

// route returns the replica a message of topic from ip goes to, or nil
// and why not.
func (l *listener) route(topic string, ip netip.Addr, hasIP bool, bound *ingester) (*ingester, Reason) {
	addr, _, ok := ParseTopic(topic)
	g := l.s.byAddr[addr]
	if !ok || g == nil {
		l.unmatched.Add(1)
		return nil, RejectUnknownTopic
	}
	if bound != nil && g != bound {
		return nil, RejectTopic
	}
	if hasIP && !l.s.peers.allowed(ip) && !slices.Contains(g.hosts, ip) {
		return nil, RejectTopic
	}
	return g, 0
}

// ended counts the error that ended a connection if it was the peer's
// fault.
func (l *listener) ended(err error, peer string) {
	if r, ok := readReason(err); ok {
		l.s.rej.add(l.s.cfg.Logger, r, 1, "kv events: connection closed", "peer", peer, "err", err)
	}
}

// drop closes nc and frees its slot, unless a new connection took it
// (takeSlot).
func (l *listener) drop(nc net.Conn) {
	nc.Close()
	l.mu.Lock()
	_, held := l.conns[nc]
	delete(l.conns, nc)
	l.mu.Unlock()
	if held {
		<-l.slots
	}
}

// close stops accepting and closes every connection; their goroutines
// then end.
func (l *listener) close() {
	l.ln.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for nc := range l.conns {
		nc.Close()
	}
}

package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// Type is a ZMQ socket type as READY's Socket-Type property names it.
type Type string

// The socket types this package speaks as, and their usual peers.
const (
	Sub    Type = "SUB"
	Pub    Type = "PUB"
	Dealer Type = "DEALER"
	Router Type = "ROUTER"
)

// greetingBytes is a ZMTP greeting's length: signature (10), version (2),
// mechanism (20), as-server (1), filler (31).
const greetingBytes = 64

// greeting is this peer's greeting: ZMTP 3.0, NULL, not as-server.
func greeting() []byte {
	g := make([]byte, greetingBytes)
	g[0], g[9], g[10], g[11] = 0xFF, 0x7F, 3, 0
	copy(g[12:32], "NULL")
	return g
}

// checkGreeting accepts a ZMTP 3.x NULL greeting.
func checkGreeting(g []byte) error {
	if g[0] != 0xFF || g[9] != 0x7F {
		return fmt.Errorf("%w: not a ZMTP 3 signature", ErrHandshake)
	}
	if g[10] < 3 {
		return fmt.Errorf("%w: ZMTP %d.%d, want 3.x", ErrHandshake, g[10], g[11])
	}
	if m := string(bytes.TrimRight(g[12:32], "\x00")); m != "NULL" {
		return fmt.Errorf("%w: mechanism %q, want NULL", ErrHandshake, m)
	}
	return nil
}

// Handshake runs the ZMTP greeting and NULL READY exchange over nc as a
// socket of type t, within lim.HandshakeTimeout, and returns the Conn.
// On error nc is left open for the caller to close.
func Handshake(nc net.Conn, t Type, lim Limits) (*Conn, error) {
	lim = lim.withDefaults()
	c := &Conn{nc: nc, r: bufio.NewReaderSize(nc, 4096), lim: lim}
	c.deadline = c.capped(lim.HandshakeTimeout)
	defer func() { c.deadline = time.Time{} }()
	if err := c.write(append(greeting(), readyFrame(t)...)); err != nil {
		return nil, fmt.Errorf("%w: send: %w", ErrHandshake, err)
	}
	if err := c.nc.SetReadDeadline(c.deadline); err != nil {
		return nil, err
	}
	g := make([]byte, greetingBytes)
	if _, err := io.ReadFull(c.r, g); err != nil {
		return nil, fmt.Errorf("%w: greeting: %w", ErrHandshake, err)
	}
	if err := checkGreeting(g); err != nil {
		return nil, err
	}
	_, body, err := c.readFrame(0, true)
	if err != nil {
		return nil, fmt.Errorf("%w: READY: %w", ErrHandshake, err)
	}
	peer, err := parseReady(body)
	if err != nil {
		return nil, err
	}
	if !compatible(t, peer) {
		return nil, fmt.Errorf("%w: a %s cannot talk to a %s", ErrHandshake, t, peer)
	}
	c.peer = peer
	return c, nil
}

// readyFrame is the READY command announcing socket type t.
func readyFrame(t Type) []byte {
	body := append([]byte{5}, "READY"...)
	body = appendProperty(body, "Socket-Type", string(t))
	return appendFrame(nil, flagCommand, body)
}

func appendProperty(b []byte, name, value string) []byte {
	b = append(b, byte(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
	return append(b, value...)
}

// parseReady reads a READY command's Socket-Type.
func parseReady(body []byte) (Type, error) {
	name, props, err := parseCommand(body)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrHandshake, err)
	}
	if name != "READY" {
		return "", fmt.Errorf("%w: command %q, want READY", ErrHandshake, name)
	}
	var t Type
	for len(props) > 0 {
		n := int(props[0])
		if len(props) < 1+n+4 {
			return "", fmt.Errorf("%w: truncated READY property", ErrHandshake)
		}
		key := string(props[1 : 1+n])
		vlen := binary.BigEndian.Uint32(props[1+n:])
		rest := props[1+n+4:]
		if uint64(vlen) > uint64(len(rest)) {
			return "", fmt.Errorf("%w: truncated READY property %q", ErrHandshake, key)
		}
		if strings.EqualFold(key, "Socket-Type") {
			t = Type(rest[:vlen])
		}
		props = rest[vlen:]
	}
	if t == "" {
		return "", fmt.Errorf("%w: READY without Socket-Type", ErrHandshake)
	}
	return t, nil
}

// compatible reports whether a local socket of type local may talk to a
// peer of type peer (ZMTP 3.0, "Socket types").
func compatible(local, peer Type) bool {
	switch local {
	case Sub:
		return peer == Pub || peer == "XPUB"
	case Pub:
		return peer == Sub || peer == "XSUB"
	case Dealer:
		return peer == Router || peer == Dealer || peer == "REP"
	case Router:
		return peer == Dealer || peer == "REQ" || peer == Router
	}
	return false
}

// Dial connects to endpoint ("tcp://host:port" or "ipc://path") and runs
// the handshake as t; lim.HandshakeTimeout bounds connect and handshake
// together, ctx cancels them.
func Dial(ctx context.Context, endpoint string, t Type, lim Limits) (*Conn, error) {
	lim = lim.withDefaults()
	network, addr, err := splitEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, lim.HandshakeTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("zmtp: dial %s: %w", endpoint, err)
	}
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	c, err := Handshake(nc, t, lim)
	if !stop() || err != nil {
		nc.Close()
		if err == nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("zmtp: %s: %w", endpoint, err)
	}
	return c, nil
}

// Listen opens a listener on endpoint: "tcp://host:port" ("*" for every
// interface, port 0 for any) or "ipc://path" (a stale socket file at path
// is replaced).
func Listen(endpoint string) (net.Listener, error) {
	network, addr, err := splitEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	if network == "unix" {
		os.Remove(addr)
	}
	l, err := net.Listen(network, addr)
	if err != nil {
		return nil, fmt.Errorf("zmtp: listen %s: %w", endpoint, err)
	}
	return l, nil
}

// Dialable turns endpoint, bound at addr, into an endpoint a local peer
// can dial: tcp://127.0.0.1:PORT for a wildcard host, the real port for
// a wildcard port; other endpoints as they are.
func Dialable(endpoint string, addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || !strings.HasPrefix(endpoint, "tcp://") {
		return endpoint
	}
	host := "127.0.0.1"
	if !tcp.IP.IsUnspecified() {
		host = tcp.IP.String()
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(tcp.Port))
}

// splitEndpoint maps a ZMQ endpoint to a Go network and address.
func splitEndpoint(endpoint string) (network, addr string, err error) {
	if rest, ok := strings.CutPrefix(endpoint, "tcp://"); ok {
		host, port, err := net.SplitHostPort(rest)
		if err != nil {
			return "", "", fmt.Errorf("zmtp: endpoint %q: %w", endpoint, err)
		}
		if host == "*" {
			host = ""
		}
		if port == "*" {
			port = "0"
		}
		return "tcp", net.JoinHostPort(host, port), nil
	}
	if rest, ok := strings.CutPrefix(endpoint, "ipc://"); ok && rest != "" {
		return "unix", rest, nil
	}
	return "", "", fmt.Errorf("zmtp: endpoint %q: want tcp://host:port or ipc://path", endpoint)
}

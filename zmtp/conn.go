// Package zmtp is a minimal ZMTP 3.0 peer (https://rfc.zeromq.org/spec/23/)
// for the sockets the router speaks to inference engines: SUB (KV events
// from a PUB) and DEALER (replays from a ROUTER), with the NULL mechanism
// only. PUB is there for tests that forge a publisher.
//
// Why not github.com/go-zeromq/zmq4 (v0.17.0), which the router used
// before: on a socket anyone can reach it cannot be made safe from
// outside. It allocates whatever size a frame header claims (a greeting
// and one header claiming 2^40 bytes: "fatal error: runtime: out of
// memory"), including during the handshake; it runs each peer's handshake
// inside its accept loop without a deadline (one idle TCP connection
// blocks every other engine's connect); and it merges every peer's
// messages into one queue without saying which peer sent one, so no
// remote-address check is possible. A net.Conn wrapper parsing frame
// headers could cap sizes but fix neither of the other two, and a patch
// carried in the repo would touch zmq4's socket, connection and reader
// code. The subset needed here (greeting, READY, frames, subscription) is
// some 400 lines, and every limit is checked before the memory it guards
// is allocated: a frame's body is read into a buffer grown as bytes
// arrive, never sized from the header.
//
// Interoperability: the greeting announces ZMTP 3.0, so libzmq (vLLM,
// SGLang via pyzmq) and zmq4 peers send and expect 3.0 framing and
// message-form subscriptions ("\x01" + prefix); PING is answered with
// PONG should a 3.1 peer send one, other commands are ignored.
package zmtp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"
)

// Frame flag bits (ZMTP 3.0 section "Framing").
const (
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
)

// maxCommandBytes bounds a command frame (READY, PING, ...): the commands
// this peer understands are tiny.
const maxCommandBytes = 16 << 10

// chunkBytes is the step in which a large frame's buffer grows as its
// bytes arrive.
const chunkBytes = 64 << 10

// Errors a Conn returns, wrapped with detail; test with errors.Is.
var (
	// ErrTooLarge is a frame or message whose header claims more than
	// the Limits allow; nothing of it was allocated.
	ErrTooLarge = errors.New("zmtp: message too large")
	// ErrHandshake is a greeting or READY that is not ZMTP 3 NULL from a
	// compatible socket type.
	ErrHandshake = errors.New("zmtp: bad handshake")
	// ErrProtocol is a frame sequence that breaks the ZMTP grammar.
	ErrProtocol = errors.New("zmtp: protocol error")
)

// Limits bound what a peer can make a Conn allocate and how long it can
// keep it waiting.
type Limits struct {
	// MaxMessageBytes bounds the sum of a message's frame sizes, checked
	// on each frame header before the frame is read. Zero means 16 MiB.
	MaxMessageBytes int64
	// MaxFrames bounds the frames of one message. Zero means 16.
	MaxFrames int
	// HandshakeTimeout bounds the greeting and READY exchange (and, for
	// Dial, the TCP connect). Zero means 5 s.
	HandshakeTimeout time.Duration
	// ReadTimeout bounds the reading of one message from its first byte
	// to its last, and the writing of one. The wait for a message's first
	// byte is unbounded (an idle engine publishes nothing) unless
	// SetDeadline says otherwise. Zero means 30 s.
	ReadTimeout time.Duration
}

// withDefaults fills the zero fields.
func (l Limits) withDefaults() Limits {
	if l.MaxMessageBytes <= 0 {
		l.MaxMessageBytes = 16 << 20
	}
	if l.MaxFrames <= 0 {
		l.MaxFrames = 16
	}
	if l.HandshakeTimeout <= 0 {
		l.HandshakeTimeout = 5 * time.Second
	}
	if l.ReadTimeout <= 0 {
		l.ReadTimeout = 30 * time.Second
	}
	return l
}

// Conn is one ZMTP connection after a completed handshake. Recv and Send
// may be called from different goroutines, but each from one at a time.
type Conn struct {
	nc       net.Conn
	r        *bufio.Reader
	lim      Limits
	peer     Type
	deadline time.Time // caps every read and write; zero: none
}

// PeerType is the socket type the peer announced in its READY.
func (c *Conn) PeerType() Type { return c.peer }

// Close closes the connection.
func (c *Conn) Close() error { return c.nc.Close() }

// SetDeadline caps every later read and write at t (zero: no cap beyond
// Limits.ReadTimeout per message); a replay exchange uses it to bound
// itself as a whole.
func (c *Conn) SetDeadline(t time.Time) { c.deadline = t }

// capped returns the earlier of now+d and the Conn's deadline.
func (c *Conn) capped(d time.Duration) time.Time {
	t := time.Now().Add(d)
	if !c.deadline.IsZero() && c.deadline.Before(t) {
		return c.deadline
	}
	return t
}

// Recv reads the next message: its frames, in order. Commands between
// messages are handled (PING answered, ERROR returned as an error) and
// never returned. A frame larger than the Limits fails with ErrTooLarge
// before its body is read; the Conn is then unusable (the stream is out
// of step) and should be closed.
func (c *Conn) Recv() ([][]byte, error) {
	for {
		if err := c.nc.SetReadDeadline(c.deadline); err != nil {
			return nil, err
		}
		if _, err := c.r.Peek(1); err != nil {
			return nil, err
		}
		if err := c.nc.SetReadDeadline(c.capped(c.lim.ReadTimeout)); err != nil {
			return nil, err
		}
		frames, cmd, err := c.readMessage()
		if err != nil {
			return nil, err
		}
		if cmd == nil {
			return frames, nil
		}
		if err := c.command(cmd); err != nil {
			return nil, err
		}
	}
}

// readMessage reads one message, or one command (cmd not nil).
func (c *Conn) readMessage() (frames [][]byte, cmd []byte, err error) {
	budget := c.lim.MaxMessageBytes
	for {
		flags, body, err := c.readFrame(budget, len(frames) == 0)
		if err != nil {
			return nil, nil, err
		}
		if flags&flagCommand != 0 {
			return nil, body, nil
		}
		frames = append(frames, body)
		budget -= int64(len(body))
		if flags&flagMore == 0 {
			return frames, nil, nil
		}
		if len(frames) >= c.lim.MaxFrames {
			return nil, nil, fmt.Errorf("%w: more than %d frames in a message", ErrTooLarge, c.lim.MaxFrames)
		}
	}
}

// readFrame reads one frame whose body may be at most budget bytes;
// first says whether a command may start here.
func (c *Conn) readFrame(budget int64, first bool) (flags byte, body []byte, err error) {
	flags, err = c.r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	if flags&^(flagMore|flagLong|flagCommand) != 0 {
		return 0, nil, fmt.Errorf("%w: reserved frame flags %#02x", ErrProtocol, flags)
	}
	cmd := flags&flagCommand != 0
	if cmd && (!first || flags&flagMore != 0) {
		return 0, nil, fmt.Errorf("%w: command inside a message", ErrProtocol)
	}
	size, err := c.readSize(flags)
	if err != nil {
		return 0, nil, err
	}
	if cmd {
		budget = maxCommandBytes
	}
	if size > uint64(budget) {
		return 0, nil, fmt.Errorf("%w: frame of %d bytes, %d allowed", ErrTooLarge, size, budget)
	}
	body, err = readBody(c.r, int(size))
	return flags, body, err
}

func (c *Conn) readSize(flags byte) (uint64, error) {
	if flags&flagLong == 0 {
		b, err := c.r.ReadByte()
		return uint64(b), err
	}
	var b [8]byte
	if _, err := io.ReadFull(c.r, b[:]); err != nil {
		return 0, err
	}
	return binary.BigEndian.Uint64(b[:]), nil
}

// readBody reads n bytes into a buffer that grows as they arrive (by
// chunkBytes, amortized by append), so that a peer claiming a large frame
// and sending little costs little.
func readBody(r *bufio.Reader, n int) ([]byte, error) {
	if n <= chunkBytes {
		b := make([]byte, n)
		_, err := io.ReadFull(r, b)
		return b, err
	}
	b := make([]byte, 0, chunkBytes)
	for len(b) < n {
		step := min(n-len(b), chunkBytes)
		b = slices.Grow(b, step)
		if _, err := io.ReadFull(r, b[len(b):len(b)+step]); err != nil {
			return nil, err
		}
		b = b[:len(b)+step]
	}
	return b, nil
}

// command handles a command received between messages.
func (c *Conn) command(body []byte) error {
	name, data, err := parseCommand(body)
	if err != nil {
		return err
	}
	switch name {
	case "PING": // 3.1: TTL (2 bytes), then a context the PONG echoes
		if len(data) < 2 {
			return fmt.Errorf("%w: short PING", ErrProtocol)
		}
		return c.sendCommand("PONG", data[2:])
	case "ERROR":
		return fmt.Errorf("zmtp: peer error: %q", data)
	}
	return nil // SUBSCRIBE, CANCEL, PONG, unknown: nothing to do
}

// parseCommand splits a command frame into its name and data.
func parseCommand(body []byte) (name string, data []byte, err error) {
	if len(body) == 0 || int(body[0]) > len(body)-1 {
		return "", nil, fmt.Errorf("%w: malformed command", ErrProtocol)
	}
	n := int(body[0])
	return string(body[1 : 1+n]), body[1+n:], nil
}

// Send writes one message of the given frames.
func (c *Conn) Send(frames ...[]byte) error {
	var buf []byte
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags |= flagMore
		}
		buf = appendFrame(buf, flags, f)
	}
	return c.write(buf)
}

// Subscribe asks a PUB peer for the messages whose first frame starts
// with prefix (ZMTP 3.0's message form; "" is every message).
func (c *Conn) Subscribe(prefix string) error {
	return c.Send(append([]byte{1}, prefix...))
}

func (c *Conn) sendCommand(name string, data []byte) error {
	body := append([]byte{byte(len(name))}, name...)
	return c.write(appendFrame(nil, flagCommand, append(body, data...)))
}

func (c *Conn) write(b []byte) error {
	if err := c.nc.SetWriteDeadline(c.capped(c.lim.ReadTimeout)); err != nil {
		return err
	}
	_, err := c.nc.Write(b)
	return err
}

// appendFrame appends one frame (header and body) to buf.
func appendFrame(buf []byte, flags byte, body []byte) []byte {
	if len(body) > 255 {
		buf = append(buf, flags|flagLong)
		buf = binary.BigEndian.AppendUint64(buf, uint64(len(body)))
	} else {
		buf = append(buf, flags, byte(len(body)))
	}
	return append(buf, body...)
}

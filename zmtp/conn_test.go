package zmtp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/google/go-cmp/cmp"

	"github.com/kvrouter/kvrouter/internal/wait"
)

// TestSubFromZmq4Pub: a SUB dialing a zmq4 PUB subscribes and receives
// multi-frame messages, short and long frames alike.
func TestSubFromZmq4Pub(t *testing.T) {
	pub := zmq4.NewPub(context.Background())
	defer pub.Close()
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	c, err := Dial(context.Background(), "tcp://"+pub.Addr().String(), Sub, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.PeerType() != Pub {
		t.Errorf("peer type %q, want PUB", c.PeerType())
	}
	if err := c.Subscribe(""); err != nil {
		t.Fatal(err)
	}
	want := [][]byte{[]byte("topic"), {0, 0, 0, 0, 0, 0, 0, 7}, bytes.Repeat([]byte("x"), 70_000)}
	got := make(chan [][]byte, 1)
	go func() {
		f, err := c.Recv()
		if err != nil {
			t.Error(err)
		}
		got <- f
	}()
	wait.For(t, "the subscription at the PUB", func() bool {
		if len(got) > 0 {
			return true
		}
		if err := pub.SendMulti(zmq4.NewMsgFrom(want...)); err != nil {
			t.Fatal(err)
		}
		return false
	})
	if d := cmp.Diff(want, <-got); d != "" {
		t.Errorf("message (-want +got):\n%s", d)
	}
}

// TestDealerToZmq4Router: a DEALER's request reaches a zmq4 ROUTER as
// [identity, "", payload] and its reply comes back without the identity.
func TestDealerToZmq4Router(t *testing.T) {
	r := zmq4.NewRouter(context.Background())
	defer r.Close()
	if err := r.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	go func() {
		m, err := r.Recv()
		if err != nil || len(m.Frames) != 3 {
			t.Errorf("router got %q, %v; want [id, \"\", req]", m.Frames, err)
			return
		}
		r.SendMulti(zmq4.NewMsgFrom(m.Frames[0], nil, []byte("reply")))
	}()
	d, err := Dial(context.Background(), "tcp://"+r.Addr().String(), Dealer, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	d.SetDeadline(time.Now().Add(10 * time.Second))
	if err := d.Send(nil, []byte("req")); err != nil {
		t.Fatal(err)
	}
	f, err := d.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([][]byte{{}, []byte("reply")}, f); d != "" {
		t.Errorf("reply (-want +got):\n%s", d)
	}
}

// handshakeBytes is a valid ZMTP 3.0 NULL greeting and READY of type t.
func handshakeBytes(t Type) []byte { return append(greeting(), readyFrame(t)...) }

// header is a frame header claiming size bytes.
func header(flags byte, size uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{flags | flagLong}, size)
}

// serveOnce accepts one TCP connection on loopback, handshakes it as a
// SUB with lim and reads until an error, which it returns with the time
// it took (time first); peer writes the hostile side through the returned conn.
func serveOnce(t *testing.T, lim Limits, peer func(net.Conn)) (time.Duration, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	nc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	go func() {
		peer(pc)
		// keep the connection open: the server must end it itself
	}()
	start := time.Now()
	c, err := Handshake(nc, Sub, lim)
	for err == nil {
		_, err = c.Recv()
	}
	return time.Since(start), err
}

// TestHostile: each hostile peer ends the connection with the right
// error, quickly, without the memory its claims would take.
func TestHostile(t *testing.T) {
	lim := Limits{MaxMessageBytes: 1 << 20, MaxFrames: 4, HandshakeTimeout: 300 * time.Millisecond, ReadTimeout: 300 * time.Millisecond}
	write := func(parts ...[]byte) func(net.Conn) {
		return func(c net.Conn) { c.Write(bytes.Join(parts, nil)) }
	}
	pub := handshakeBytes(Pub)
	tests := []struct {
		name string
		peer func(net.Conn)
		want error
	}{
		{"74 bytes: greeting and a READY claiming 2^40", write(greeting(), header(flagCommand, 1<<40), []byte{5}), ErrTooLarge},
		{"message frame claiming 2^40", write(pub, header(0, 1<<40)), ErrTooLarge},
		{"frames adding up past the limit", write(pub, header(flagMore, 600<<10), make([]byte, 600<<10), header(0, 600<<10)), ErrTooLarge},
		{"too many frames", write(pub, bytes.Repeat([]byte{flagMore, 0}, 10)), ErrTooLarge},
		{"reserved flag bits", write(pub, []byte{0x80, 0}), ErrProtocol},
		{"command inside a message", write(pub, []byte{flagMore, 0, flagCommand, 0}), ErrProtocol},
		{"not ZMTP", write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), make([]byte, 64)), ErrHandshake},
		{"ZMTP 2", write(append(greeting()[:10], append([]byte{2, 0}, greeting()[12:]...)...)), ErrHandshake},
		{"PLAIN mechanism", write(bytes.Replace(greeting(), []byte("NULL"), []byte("PLAN"), 1), readyFrame(Pub)), ErrHandshake},
		{"incompatible socket type", write(handshakeBytes(Sub)), ErrHandshake},
		{"silence: handshake deadline", func(net.Conn) {}, os.ErrDeadlineExceeded},
		{"half a greeting", write(greeting()[:30]), os.ErrDeadlineExceeded},
		{"a frame started, never finished", write(pub, header(0, 1000), make([]byte, 10)), os.ErrDeadlineExceeded},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			took, err := serveOnce(t, lim, tt.peer)
			if !errors.Is(err, tt.want) {
				t.Errorf("got %v, want %v", err, tt.want)
			}
			if took > 3*time.Second {
				t.Errorf("took %v", took)
			}
		})
	}
}

// TestClaimCostsWhatArrives: a peer that claims a 1 GiB frame within the
// limit and sends 100 KiB of it costs about 100 KiB, not 1 GiB.
func TestClaimCostsWhatArrives(t *testing.T) {
	lim := Limits{MaxMessageBytes: 2 << 30, ReadTimeout: 300 * time.Millisecond}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := serveOnce(t, lim, func(c net.Conn) {
		c.Write(append(handshakeBytes(Pub), header(0, 1<<30)...))
		c.Write(make([]byte, 100<<10))
	})
	runtime.ReadMemStats(&after)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("got %v, want a read deadline", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 {
		t.Errorf("allocated %d bytes for 100 KiB received, want < 8 MiB", alloc)
	}
}

// TestPingAnswered: a PING between messages is answered with a PONG
// echoing its context, and never returned as a message.
func TestPingAnswered(t *testing.T) {
	pong := make(chan []byte, 1)
	_, err := serveOnce(t, Limits{ReadTimeout: time.Second}, func(c net.Conn) {
		ping := appendFrame(nil, flagCommand, append([]byte("\x04PING\x00\x0a"), "ctx"...))
		c.Write(append(handshakeBytes(Pub), ping...))
		buf := make([]byte, 64+len(readyFrame(Sub))+2+5+3)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _ := io.ReadFull(c, buf)
		pong <- buf[64+len(readyFrame(Sub)) : n]
		c.Close()
	})
	if err == nil || errors.Is(err, ErrProtocol) {
		t.Errorf("ended with %v, want EOF", err)
	}
	if got, want := <-pong, appendFrame(nil, flagCommand, []byte("\x04PONGctx")); !bytes.Equal(got, want) {
		t.Errorf("pong %q, want %q", got, want)
	}
}

// TestSplitEndpoint covers the endpoints Dial and Listen accept.
func TestSplitEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"tcp://127.0.0.1:5557": "tcp 127.0.0.1:5557",
		"tcp://*:5557":         "tcp :5557",
		"tcp://127.0.0.1:*":    "tcp 127.0.0.1:0",
		"tcp://[::1]:5557":     "tcp [::1]:5557",
		"ipc:///tmp/kv.sock":   "unix /tmp/kv.sock",
		"inproc://x":           "error",
		"udp://x:1":            "error",
	} {
		n, a, err := splitEndpoint(in)
		got := n + " " + a
		if err != nil {
			got = "error"
		}
		if got != want {
			t.Errorf("%s: got %q, want %q", in, got, want)
		}
		if err != nil && !strings.Contains(err.Error(), in) {
			t.Errorf("%s: error %q does not name the endpoint", in, err)
		}
	}
}

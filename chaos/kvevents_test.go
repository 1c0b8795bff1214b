package chaos

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/zmtp"
)

// rssSlack is how much a router's RSS may grow under an attack that must
// cost it nothing.
const rssSlack = 5 << 20

// greeting74 is the 74 bytes: a ZMTP 3.0 NULL greeting, then a
// READY command frame whose header claims 2^40 bytes, and its first byte.
func greeting74() []byte {
	return append(zmtpGreeting(), 0x06, 0, 0, 1, 0, 0, 0, 0, 0, 5)
}

// zmtpGreeting is a ZMTP 3.0 NULL greeting.
func zmtpGreeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10] = 0xFF, 0x7F, 3
	copy(g[12:], "NULL")
	return g
}

// pubHandshake is a greeting and a PUB's READY, then a message frame
// whose header claims 2^40 bytes.
func pubHandshakeHuge() []byte {
	body := append([]byte("\x05READY\x0bSocket-Type"), binary.BigEndian.AppendUint32(nil, 3)...)
	body = append(body, "PUB"...)
	b := append(zmtpGreeting(), 0x04, byte(len(body)))
	return append(append(b, body...), 0x02, 0, 0, 1, 0, 0, 0, 0, 0)
}

// metric returns the value of the series (name and labels exactly as
// exposed) on url's /metrics, or -1 if it is absent.
func metric(t *testing.T, url, series string) float64 {
	t.Helper()
	for line := range strings.Lines(metricsText(t, url)) {
		if v, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", series, err)
			}
			return f
		}
	}
	return -1
}

// rejected is the router's count of KV-event rejections of reason.
func rejected(t *testing.T, rt *proc, reason string) float64 {
	return metric(t, rt.AdminURL(), fmt.Sprintf("kvrouter_kv_events_rejected_total{reason=%q}", reason))
}

// blocks is the router's count of engine blocks it knows replica holds.
func blocks(t *testing.T, rt *proc, replica string) float64 {
	return metric(t, rt.AdminURL(), fmt.Sprintf("kvrouter_kv_event_blocks{replica=%q}", replica))
}

// kvFleet runs an engine that dials the router's bind socket and a
// router binding it, with extra router args; it returns both and the
// bind endpoint.
func kvFleet(t *testing.T, routerArgs ...string) (e, rt *proc, bind string) {
	t.Helper()
	bind = "tcp://" + freeAddr(t)
	e = startEngine(t, "--time-scale", "0.01", "--kv-events-endpoint", bind)
	rt = startRouter(t, []*proc{e}, append([]string{"--kv-events-bind", bind, "--tokenizer", "remote"}, routerArgs...)...)
	waitReady(t, rt.URL(), "/health", 10*time.Second)
	return e, rt, bind
}

// warm sends prompts through the router until the router knows more
// than had blocks on e, and returns how many it knows.
func warm(t *testing.T, rt, e *proc, had float64) float64 {
	t.Helper()
	var n atomic.Int64
	wait.For(t, "the engine's KV events at the router", func() bool {
		i := n.Add(1)
		prompt := fmt.Sprintf("request %d: %s", i, strings.Repeat(fmt.Sprintf("word%d ", i), 100))
		resp, err := post(context.Background(), t, rt.URL(), "/v1/chat/completions", chat(prompt, 2, false))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return blocks(t, rt, e.URL()) > had
	})
	return blocks(t, rt, e.URL())
}

// exercise sends rt a few requests and metrics reads, so that its RSS
// afterwards is past its start-up growth.
func exercise(t *testing.T, rt *proc) {
	t.Helper()
	for i := range 30 {
		resp, err := post(context.Background(), t, rt.URL(), "/v1/chat/completions", chat(fmt.Sprintf("warm-up %d", i), 4, i%2 == 0))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		metric(t, rt.AdminURL(), "kvrouter_kv_event_unmatched_total")
	}
}

// attacks is how many times each attack is repeated: 10, or 1,000 with
// -chaos.long.
func attacks() int {
	if *long {
		return 1000
	}
	return 10
}

// attack writes b to a new connection to addr and waits up to 5 s for
// the router to close it.
func attack(t *testing.T, addr string, b []byte) {
	t.Helper()
	nc, err := net.Dial("tcp", strings.TrimPrefix(addr, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, nc); err != nil && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		t.Errorf("router did not close the attacking connection: %v", err)
	}
}

func isReset(err error) bool { return strings.Contains(err.Error(), "connection reset") }

// TestKVEventsHugeFrameBind: the 74 bytes (and a frame of 2^40
// after a valid handshake) on --kv-events-bind: the router closes the
// connection, stays up with its RSS unchanged, counts both, and keeps
// following the engine.
func TestKVEventsHugeFrameBind(t *testing.T) {
	e, rt, bind := kvFleet(t)
	had := warm(t, rt, e, 0)
	exercise(t, rt)
	before := rt.RSS()
	n := attacks()
	for range n {
		attack(t, bind, greeting74())
		attack(t, bind, pubHandshakeHuge())
	}
	if !rt.Alive() {
		t.Fatalf("router died; log:\n%s", rt.Log())
	}
	waitReady(t, rt.URL(), "/health", 5*time.Second)
	after := rt.RSS()
	t.Logf("RSS %d -> %d bytes over %d attacks of each kind", before, after, n)
	if grew := after - before; grew > rssSlack {
		t.Errorf("RSS grew %d bytes under the attack, want < %d", grew, rssSlack)
	}
	if got := rejected(t, rt, "size"); got != float64(2*n) {
		t.Errorf("size rejections %v, want %d", got, 2*n)
	}
	warm(t, rt, e, had) // the engine's stream still arrives
}

// TestKVEventsHugeFramePublisher: a fake publisher behind kv= claiming
// 2^40 bytes (in its READY, then in a message) is refused on every
// reconnect, with backoff; the router stays up, its RSS unchanged.
func TestKVEventsHugeFramePublisher(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	armed := make(chan struct{})
	var conns atomic.Int64
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			i := conns.Add(1)
			go func() {
				defer nc.Close()
				select {
				case <-armed:
				case <-time.After(30 * time.Second):
					return
				}
				if i%2 == 0 {
					nc.Write(greeting74())
				} else {
					nc.Write(pubHandshakeHuge())
				}
				io.Copy(io.Discard, nc)
			}()
		}
	}()
	e := startEngine(t, "--time-scale", "0.01")
	kv := "tcp://" + ln.Addr().String()
	admin := freeAddr(t)
	rt := start(t, "serve", "--backend", e.URL()+",kv="+kv+",replay="+kv, "--tokenizer", "remote", "--health-interval", "100ms",
		"--admin-listen", admin)
	rt.admin = admin
	waitReady(t, rt.URL(), "/health", 10*time.Second)
	wait.For(t, "the router's dial", func() bool { return conns.Load() > 0 })
	exercise(t, rt)
	before := rt.RSS()
	close(armed)
	n := 4.0 // redialled with doubling backoff: 4 take 1.5 s, 12 about 40 s
	if *long {
		n = 12
	}
	wait.Within(t, 90*time.Second, "refused frames", func() bool { return rejected(t, rt, "size") >= n })
	if !rt.Alive() {
		t.Fatalf("router died; log:\n%s", rt.Log())
	}
	after := rt.RSS()
	t.Logf("RSS %d -> %d bytes over %v refused frames", before, after, n)
	if grew := after - before; grew > rssSlack {
		t.Errorf("RSS grew %d bytes under the attack, want < %d", grew, rssSlack)
	}
	if got := metric(t, rt.AdminURL(), fmt.Sprintf("kvrouter_kv_events_connected{replica=%q}", e.URL())); got != 0 {
		t.Errorf("connected %v to a publisher that never spoke ZMTP sanely, want 0", got)
	}
}

// storedPayload is a legacy-encoded batch storing n chained blocks of 16
// tokens from the root.
func storedPayload(t *testing.T, n int) []byte {
	hashes, tokens := make([]any, n), make([]any, 16*n)
	for i := range hashes {
		hashes[i] = i + 1
	}
	for i := range tokens {
		tokens[i] = i + 1
	}
	b, err := msgpack.Marshal([]any{0.0, []any{[]any{"BlockStored", hashes, nil, tokens, 16, nil, "GPU", nil}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// forge dials bind from local and handshakes as a PUB.
func forge(t *testing.T, bind, local string) (*zmtp.Conn, error) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	nc, err := d.Dial("tcp", strings.TrimPrefix(bind, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return zmtp.Handshake(nc, zmtp.Pub, zmtp.Limits{HandshakeTimeout: 5 * time.Second})
}

// TestKVEventsForgedPublisher: on the bind socket, a peer that is no
// backend's host is cut off before its handshake, and a backend's host
// claiming another backend's topic (the 1,200 forged cached
// tokens: 75 blocks of 16) is refused; both counted, no index changed.
func TestKVEventsForgedPublisher(t *testing.T) {
	other := "http://127.0.0.2:" + strings.Split(freeAddr(t), ":")[1] // a backend on another host, with no engine
	e, rt, bind := kvFleet(t, "--backend", other)
	had := warm(t, rt, e, 0)

	if _, err := forge(t, bind, "127.0.0.3"); err == nil {
		t.Error("a peer that is no backend's host completed its handshake")
	}
	wait.For(t, "the peer rejection", func() bool { return rejected(t, rt, "peer") == 1 })

	p, err := forge(t, bind, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	topic := "kv@" + strings.TrimPrefix(other, "http://") + "@emulated"
	if err := p.Send([]byte(topic), make([]byte, 8), storedPayload(t, 75)); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the topic rejection", func() bool { return rejected(t, rt, "topic") == 1 })
	if got := blocks(t, rt, other); got > 0 {
		t.Errorf("the other backend has %v blocks from a forged topic, want 0", got)
	}
	if got := blocks(t, rt, e.URL()); got != had {
		t.Errorf("the engine's blocks went from %v to %v", had, got)
	}
}

// TestKVEventsIdleConnection: idle TCP connections on the bind socket,
// opened before the engine dials, do not stop its connect: its events
// arrive while they are still open.
func TestKVEventsIdleConnection(t *testing.T) {
	bind := "tcp://" + freeAddr(t)
	e := startEngine(t, "--time-scale", "0.01", "--kv-events-endpoint", bind)
	rt := startRouter(t, []*proc{e}, "--kv-events-bind", bind, "--tokenizer", "remote", "--kv-events-handshake-timeout", "60s")
	var idle []net.Conn
	for range 3 {
		nc, err := net.Dial("tcp", strings.TrimPrefix(bind, "tcp://"))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		idle = append(idle, nc)
	}
	waitReady(t, rt.URL(), "/health", 10*time.Second)
	warm(t, rt, e, 0)
	for i, nc := range idle {
		nc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, err := io.Copy(io.Discard, nc) // the router's greeting, then nothing
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("idle connection %d: %v, want still open", i, err)
		}
	}
}

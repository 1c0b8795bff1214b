package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/zmtp"
)

// forge dials the bind socket at endpoint from local (an IP on the
// loopback net: 127.0.0.0/8 all route to lo on Linux) and handshakes as
// a PUB: a publisher the test drives by hand.
func forge(t *testing.T, endpoint, local string) (*zmtp.Conn, error) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	nc, err := d.Dial("tcp", strings.TrimPrefix(endpoint, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return zmtp.Handshake(nc, zmtp.Pub, zmtp.Limits{HandshakeTimeout: 5 * time.Second})
}

// sendBatch publishes payload under topic as seq on c.
func sendBatch(t *testing.T, c *zmtp.Conn, topic string, seq uint64, payload []byte) {
	t.Helper()
	if err := c.Send([]byte(topic), be(seq), payload); err != nil {
		t.Fatal(err)
	}
}

// TestBindPeers: on the bind socket a host that is no replica's is cut
// off before its handshake; a replica's host may publish for it only, and
// a connection stays with the first replica it published for; Allow
// admits others.
func TestBindPeers(t *testing.T) {
	sub, idx := startSub(t, Config{Bind: "tcp://127.0.0.1:0", Replicas: []Replica{
		{ID: 0, Addr: "127.0.0.1:8000", Model: "m"},
		{ID: 1, Addr: "127.0.0.2:8000", Model: "m"},
		{ID: 2, Addr: "127.0.0.1:8001", Model: "m"},
	}, Limits: Limits{Allow: AllowList{"127.0.0.4/31"}}})
	const a, b, c = "kv@127.0.0.1:8000@m", "kv@127.0.0.2:8000@m", "kv@127.0.0.1:8001@m"
	if _, err := forge(t, sub.BindAddr(), "127.0.0.3"); err == nil {
		t.Error("a peer that is no replica's host completed its handshake")
	}
	wait.For(t, "the peer rejection", func() bool { return sub.Rejected(RejectPeer) == 1 })

	p, err := forge(t, sub.BindAddr(), "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	sendBatch(t, p, b, 0, storedBatch(t, []any{1}, nil, 0)) // 127.0.0.1 claims 127.0.0.2's replica
	sendBatch(t, p, a, 0, storedBatch(t, []any{1}, nil, 0)) // its own: binds the connection to replica 0
	sendBatch(t, p, c, 0, storedBatch(t, []any{1}, nil, 0)) // same host, but the connection is replica 0's
	sendBatch(t, p, "kv@10.9.9.9:1@m", 0, nil)
	wait.For(t, "replica 0's batch and the refusals", func() bool {
		return idx.Blocks(0) == 1 && sub.Rejected(RejectTopic) == 2 && sub.Rejected(RejectUnknownTopic) == 1
	})
	if idx.Blocks(1) != 0 || idx.Blocks(2) != 0 {
		t.Errorf("forged topics reached replicas 1 and 2: %d and %d blocks", idx.Blocks(1), idx.Blocks(2))
	}
	q, err := forge(t, sub.BindAddr(), "127.0.0.5") // in Allow
	if err != nil {
		t.Fatal(err)
	}
	sendBatch(t, q, b, 0, storedBatch(t, []any{1, 2}, nil, 0))
	wait.For(t, "the allowed peer's batch", func() bool { return idx.Blocks(1) == 2 })
	if st := status(t, sub, 0); !st.Connected {
		t.Errorf("replica 0 not connected with its connection open: %+v", st)
	}
	p.Close()
	wait.For(t, "replica 0 disconnected", func() bool { return !status(t, sub, 0).Connected })
}

// TestBindIdlePeer: idle TCP connections on the bind socket hold up no
// engine's connect, and are closed at the handshake deadline.
func TestBindIdlePeer(t *testing.T) {
	sub, idx := startSub(t, Config{Bind: "tcp://127.0.0.1:0", Limits: Limits{HandshakeTimeout: 500 * time.Millisecond},
		Replicas: []Replica{{ID: 0, Addr: "127.0.0.1:8000", Model: "m"}}})
	var idle []net.Conn
	for range 5 {
		nc, err := net.Dial("tcp", strings.TrimPrefix(sub.BindAddr(), "tcp://"))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		idle = append(idle, nc)
	}
	p, err := forge(t, sub.BindAddr(), "127.0.0.1")
	if err != nil {
		t.Fatalf("a publisher behind 5 idle connections: %v", err)
	}
	sendBatch(t, p, "kv@127.0.0.1:8000@m", 0, storedBatch(t, []any{1}, nil, 0))
	wait.For(t, "the publisher's batch", func() bool { return idx.Blocks(0) == 1 })
	for _, nc := range idle {
		nc.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadAll(nc); err != nil { // the greeting, then EOF
			t.Errorf("idle connection not closed by the router: %v", err)
		}
	}
	wait.For(t, "5 handshake rejections", func() bool { return sub.Rejected(RejectHandshake) == 5 })
}

// TestBindMaxConns: connections beyond MaxConns are closed at once and
// counted; a freed slot takes a new one.
func TestBindMaxConns(t *testing.T) {
	sub, _ := startSub(t, Config{Bind: "tcp://127.0.0.1:0", Limits: Limits{MaxConns: 2},
		Replicas: []Replica{{ID: 0, Addr: "127.0.0.1:8000", Model: "m"}}})
	var ps []*zmtp.Conn
	for range 2 {
		p, err := forge(t, sub.BindAddr(), "127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	if _, err := forge(t, sub.BindAddr(), "127.0.0.1"); err == nil {
		t.Error("a third connection completed its handshake with MaxConns 2")
	}
	if got := sub.Rejected(RejectConns); got != 1 {
		t.Errorf("conns rejections %d, want 1", got)
	}
	ps[0].Close()
	wait.For(t, "a freed slot", func() bool {
		_, err := forge(t, sub.BindAddr(), "127.0.0.1")
		return err == nil
	})
}

// TestBindHeldHandshakes: connections that hold their handshake open and
// fill the bind socket (here MaxConns 4, with a minute to finish) keep no
// engine out: a publisher that connects takes the oldest one's slot, and
// its batches are applied; each taken slot is counted.
func TestBindHeldHandshakes(t *testing.T) {
	sub, idx := startSub(t, Config{Bind: "tcp://127.0.0.1:0", Limits: Limits{MaxConns: 4, HandshakeTimeout: time.Minute},
		Replicas: []Replica{{ID: 0, Addr: "127.0.0.1:8000", Model: "m"}}})
	var held []net.Conn
	for range 4 {
		nc, err := net.Dial("tcp", strings.TrimPrefix(sub.BindAddr(), "tcp://"))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		held = append(held, nc)
	}
	time.Sleep(2 * heldHandshake) // the held handshakes must be older than a real engine's ever is
	p, err := forge(t, sub.BindAddr(), "127.0.0.1")
	if err != nil {
		t.Fatalf("a publisher behind %d held handshakes: %v", len(held), err)
	}
	sendBatch(t, p, "kv@127.0.0.1:8000@m", 0, storedBatch(t, []any{1}, nil, 0))
	wait.For(t, "the publisher's batch", func() bool { return idx.Blocks(0) == 1 })
	if got := sub.Rejected(RejectConns); got != 1 {
		t.Errorf("conns rejections %d, want 1 (the held handshake closed)", got)
	}
}

// TestSeqJump: a batch 10^9 ahead is neither applied nor trusted: the
// stream goes on from where it was, nothing reset. Two in a row are the
// publisher's real position: the replica resynchronises.
func TestSeqJump(t *testing.T) {
	p := newTestPub(t, "kv@127.0.0.1:8000@m", false, false)
	sub, idx := startSub(t, Config{Replicas: []Replica{{ID: 0, Model: "m", Endpoint: p.pubAddr}}})
	p.waitSubscribed()
	for i := range 3 {
		p.send(uint64(i), chainedBatch(t, i), false)
	}
	wait.For(t, "3 batches", func() bool { return status(t, sub, 0).Batches == 3 })
	p.send(1_000_000_000, storedBatch(t, []any{999}, nil, 900), false)
	p.send(3, chainedBatch(t, 3), false)
	wait.For(t, "batch 3", func() bool { return status(t, sub, 0).Batches == 4 })
	st := status(t, sub, 0)
	checkCounts(t, []count{{"seq jumps", sub.Rejected(RejectSeqJump), 1}, {"resets", st.Resets, 0}, {"gaps", st.Gaps, 0}})
	if !slices.Equal(sorted(idx.Hashes(0)), sorted(blocks4(4))) {
		t.Errorf("index %d blocks, want the 4 of batches 0..3", idx.Blocks(0))
	}
	p.send(2_000_000_000, storedBatch(t, []any{999}, nil, 900), false)
	p.send(2_000_000_001, storedBatch(t, []any{998}, nil, 800), false)
	wait.For(t, "the resync", func() bool { return status(t, sub, 0).Resets == 1 })
	wait.For(t, "the new position", func() bool { return idx.Blocks(0) == 1 })
	if got := sub.Rejected(RejectSeqJump); got != 2 {
		t.Errorf("seq jumps %d, want 2", got)
	}
}

// TestUnknownRemoval: removals of blocks never stored change nothing and
// are counted per block.
func TestUnknownRemoval(t *testing.T) {
	p := newTestPub(t, "kv@127.0.0.1:8000@m", false, false)
	sub, idx := startSub(t, Config{Replicas: []Replica{{ID: 0, Model: "m", Endpoint: p.pubAddr}}})
	p.waitSubscribed()
	p.send(0, chainedBatch(t, 0), false)
	p.send(1, pack(t, []any{0.0, []any{[]any{"BlockRemoved", []any{77, 78, 79}, "GPU"}}}), false)
	wait.For(t, "the removal", func() bool { return sub.Rejected(RejectUnknownRemoval) == 3 })
	if idx.Blocks(0) != 1 {
		t.Errorf("index %d blocks, want 1", idx.Blocks(0))
	}
}

// TestOversizePublisher: a publisher behind kv= claiming a 2^40-byte
// frame (in its READY, then in a message) is cut off before allocation
// and dialled again with backoff; a replay socket doing the same fails
// the replay.
func TestOversizePublisher(t *testing.T) {
	attacks := [][]byte{
		append(greetingFor(), 0x06, 0, 0, 1, 0, 0, 0, 0, 0, 5),                     // a READY of 2^40 bytes
		append(append(greetingFor(), pubReady()...), 0x02, 0, 0, 1, 0, 0, 0, 0, 0), // a message frame of 2^40
	}
	ep := attacker(t, attacks...)
	sub, _ := startSub(t, Config{Replicas: []Replica{{ID: 0, Model: "m", Endpoint: ep}}})
	wait.For(t, "4 oversize refusals", func() bool { return sub.Rejected(RejectSize) >= 4 })
	_, err := replay(context.Background(), attacker(t, attacks[0]), 0, &sub.cfg)
	if !errors.Is(err, zmtp.ErrTooLarge) {
		t.Errorf("replay from the attacker: %v, want ErrTooLarge", err)
	}
}

// attacker listens on loopback and writes the next of attacks (in turn)
// to each connection, then reads it until the peer closes.
func attacker(t *testing.T, attacks ...[]byte) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for i := 0; ; i++ {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			nc.Write(attacks[i%len(attacks)])
			go func() { io.Copy(io.Discard, nc); nc.Close() }()
		}
	}()
	return "tcp://" + ln.Addr().String()
}

// greetingFor is a ZMTP 3.0 NULL greeting.
func greetingFor() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10] = 0xFF, 0x7F, 3
	copy(g[12:], "NULL")
	return g
}

// pubReady is a PUB's READY command frame.
func pubReady() []byte {
	body := append([]byte("\x05READY\x0bSocket-Type"), binary.BigEndian.AppendUint32(nil, 3)...)
	body = append(body, "PUB"...)
	return append([]byte{0x04, byte(len(body))}, body...)
}

// TestQueueBounds: a replica's queue holds at most QueueLen messages and
// MaxQueueBytes of payload; what does not fit is dropped and counted, and
// the bytes are released as the ingester takes messages.
func TestQueueBounds(t *testing.T) {
	cfg := Config{QueueLen: 3, Limits: Limits{MaxQueueBytes: 100}, Logger: slog.New(slog.DiscardHandler), Now: func() time.Duration { return 0 },
		Index: residency.New(residency.Config{MaxReplicas: 1, DefaultCapacity: 16})}
	var rej rejects
	g := newIngester(Replica{ID: 0}, &cfg, &rej)
	g.offer(message{payload: make([]byte, 60)})
	g.offer(message{payload: make([]byte, 60)}) // 120 bytes > 100
	if got := rej.n[RejectQueue].Load(); got != 1 {
		t.Fatalf("drops %d after a message past the byte limit, want 1", got)
	}
	g.offer(message{payload: make([]byte, 10)})
	g.offer(message{payload: make([]byte, 10)})
	g.offer(message{payload: make([]byte, 10)}) // a 4th message > QueueLen
	if got, q := rej.n[RejectQueue].Load(), g.queued.Load(); got != 2 || q != 80 {
		t.Fatalf("drops %d, queued %d bytes; want 2 and 80", got, q)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go g.run(ctx)
	wait.For(t, "the ingester to take the 3 messages", func() bool { return g.c.batches.Load() == 3 })
	if q := g.queued.Load(); q != 0 {
		t.Errorf("queued %d bytes after draining, want 0", q)
	}
}

// TestConnectForeignTopic: a publisher behind one replica's kv= whose
// topic names another configured replica is refused: it would poison the
// other's index, or its own under the other's name. A topic naming no
// configured replica (an engine's pod address) is accepted.
func TestConnectForeignTopic(t *testing.T) {
	p := newTestPub(t, "kv@10.0.0.2:8000@m", false, false)
	q := newTestPub(t, "kv@10.9.9.9:8000@m", false, false)
	sub, idx := startSub(t, Config{Replicas: []Replica{
		{ID: 0, Model: "m", Endpoint: p.pubAddr, Addr: "10.0.0.1:8000"},
		{ID: 1, Model: "m", Endpoint: q.pubAddr, Addr: "10.0.0.2:8000"},
	}})
	p.waitSubscribed()
	q.waitSubscribed()
	p.send(0, chainedBatch(t, 0), false)
	q.send(0, chainedBatch(t, 0), false)
	wait.For(t, "the refusal and the accepted batch", func() bool {
		return sub.Rejected(RejectTopic) == 1 && idx.Blocks(1) == 1
	})
	if idx.Blocks(0) != 0 {
		t.Errorf("replica 0 has %d blocks from a topic naming replica 1", idx.Blocks(0))
	}
}

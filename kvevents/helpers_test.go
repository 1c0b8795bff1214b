package kvevents

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/residency"
)

// startSub starts a Subscriber over a fresh index for the test.
func startSub(t *testing.T, cfg Config) (*Subscriber, *residency.Index) {
	t.Helper()
	if cfg.Index == nil {
		cfg.Index = residency.New(residency.Config{MaxReplicas: 8, DefaultCapacity: 1 << 20})
	}
	cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 100*time.Millisecond
	if cfg.ReplayTimeout == 0 {
		cfg.ReplayTimeout = 2 * time.Second
	}
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, cfg.Index
}

// count is one counter of a Status and the value a test wants.
type count struct {
	what      string
	got, want uint64
}

// checkCounts reports each count that is not what the test wants.
func checkCounts(t *testing.T, cs []count) {
	t.Helper()
	for _, c := range cs {
		if c.got != c.want {
			t.Errorf("%s: got %d, want %d", c.what, c.got, c.want)
		}
	}
}

func status(t *testing.T, s *Subscriber, r int) Status {
	t.Helper()
	st, ok := s.Status(r)
	if !ok {
		t.Fatalf("no status for replica %d", r)
	}
	return st
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// testPub is a hand-driven vLLM publisher: a PUB socket and a ROUTER
// replay socket over a log of every batch "published", sent or not.
type testPub struct {
	t       *testing.T
	topic   string
	pub     zmq4.Socket
	router  zmq4.Socket
	old     bool // replay replies ["", seq, payload] (older vLLM, SGLang)
	mu      sync.Mutex
	log     map[uint64][]byte
	pubAddr string
	repAddr string
	wg      sync.WaitGroup
	served  atomic.Int64 // replay requests answered
}

func newTestPub(t *testing.T, topic string, replay, old bool) *testPub {
	p := &testPub{t: t, topic: topic, old: old, log: map[uint64][]byte{}}
	p.pub = zmq4.NewPub(context.Background())
	if err := p.pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	p.pubAddr = "tcp://" + p.pub.Addr().String()
	if replay {
		p.router = zmq4.NewRouter(context.Background())
		if err := p.router.Listen("tcp://127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		p.repAddr = "tcp://" + p.router.Addr().String()
		p.wg.Go(p.serve)
	}
	t.Cleanup(func() {
		p.pub.Close()
		if p.router != nil {
			p.router.Close()
		}
		p.wg.Wait()
	})
	return p
}

// waitSubscribed waits until a subscriber's subscription reached the PUB
// and, with a replay socket, its replay asked at connect was answered:
// what is published next is not in that replay.
func (p *testPub) waitSubscribed() {
	p.t.Helper()
	wait.For(p.t, "a subscriber", func() bool { return len(p.pub.(zmq4.Topics).Topics()) > 0 })
	if p.router != nil {
		wait.For(p.t, "the replay asked at connect", func() bool { return p.served.Load() > 0 })
	}
}

// send publishes payload as seq; skip keeps it for replay only (a drop).
func (p *testPub) send(seq uint64, payload []byte, skip bool) {
	p.mu.Lock()
	p.log[seq] = payload
	p.mu.Unlock()
	if skip {
		return
	}
	if err := p.pub.SendMulti(zmq4.NewMsgFrom([]byte(p.topic), be(seq), payload)); err != nil {
		p.t.Errorf("publish %d: %v", seq, err)
	}
}

// forget drops batches before seq from the replay log (an overrun buffer).
func (p *testPub) forget(seq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.log {
		if s < seq {
			delete(p.log, s)
		}
	}
}

func (p *testPub) serve() {
	for {
		m, err := p.router.Recv()
		if err != nil {
			return
		}
		if len(m.Frames) != 3 || len(m.Frames[2]) != 8 {
			p.t.Errorf("replay request frames %q", m.Frames)
			continue
		}
		id, start := m.Frames[0], binary.BigEndian.Uint64(m.Frames[2])
		p.mu.Lock()
		var seqs []uint64
		for s := range p.log {
			if s >= start {
				seqs = append(seqs, s)
			}
		}
		p.mu.Unlock()
		sortU64(seqs)
		for _, s := range seqs {
			p.mu.Lock()
			payload := p.log[s]
			p.mu.Unlock()
			p.reply(id, s, payload)
		}
		p.reply(id, EndSeq, nil)
		p.served.Add(1)
	}
}

func (p *testPub) reply(id []byte, seq uint64, payload []byte) {
	var m zmq4.Msg
	if p.old {
		m = zmq4.NewMsgFrom(id, nil, be(seq), payload)
	} else {
		m = zmq4.NewMsgFrom(id, nil, []byte(p.topic), be(seq), payload)
	}
	if err := p.router.SendMulti(m); err != nil {
		p.t.Logf("replay send: %v", err) // the client went away
	}
}

func be(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

func sortU64(s []uint64) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// storedBatch is a legacy-encoded batch storing blocks hashes (block size
// 4) after parent (nil for the root), with tokens from tok.
func storedBatch(t *testing.T, hashes []any, parent any, tok int) []byte {
	return pack(t, []any{0.0, []any{[]any{"BlockStored", hashes, parent, toks(tok, 4*len(hashes)), 4, nil, "GPU", nil}}})
}

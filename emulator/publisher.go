package emulator

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/go-zeromq/zmq4"

	"github.com/kvrouter/kvrouter/zmtp"
)

// The KV-event publisher follows vLLM's ZmqEventPublisher
// (vllm/distributed/kv_events.py): a PUB socket sending 3-frame messages
// (topic, 8-byte big-endian sequence number from 0, msgpack batch), a replay
// buffer of the last ReplayBuffer batches, and a ROUTER socket that answers
// a DEALER's ["", start_seq] with one ["", topic, seq, payload] message per
// buffered batch whose seq >= start_seq, then the end marker
// ["", "", 0xFFFFFFFFFFFFFFFF, ""].

// ReplayBuffer is how many batches the replay socket can resend (vLLM's
// buffer_steps default).
const ReplayBuffer = 10_000

// EndSeq is the sequence number of the replay end marker (vLLM's
// (-1).to_bytes(8, "big", signed=True)).
const EndSeq uint64 = 0xFFFF_FFFF_FFFF_FFFF

// pubHWM bounds the PUB send queue (vLLM's hwm default); beyond it
// messages are dropped, which subscribers see as a sequence gap.
const pubHWM = 100_000

// publisher owns the PUB and ROUTER sockets and the replay buffer.
type publisher struct {
	topic  []byte
	pub    zmq4.Socket
	router zmq4.Socket // nil without a replay endpoint
	cancel context.CancelFunc
	wg     sync.WaitGroup
	log    *slog.Logger

	pubAddr, replayAddr string // endpoints a peer can dial; "" if connecting

	mu   sync.Mutex // guards seq, ring and head
	seq  uint64     // next sequence number
	ring []replayMsg
	head int // index of the oldest entry once the ring is full
}

type replayMsg struct {
	seq     uint64
	payload []byte
}

// binds reports whether vLLM would bind (rather than connect) a socket on
// endpoint: a wildcard host or port, "::", ipc:// or inproc://. Port 0
// also binds (an ephemeral port cannot be dialled).
func binds(endpoint string) bool {
	if strings.Contains(endpoint, "*") || strings.Contains(endpoint, "::") ||
		strings.HasPrefix(endpoint, "ipc://") || strings.HasPrefix(endpoint, "inproc://") {
		return true
	}
	return strings.HasSuffix(endpoint, ":0")
}

// newPublisher opens the sockets. endpoint binds or connects by vLLM's rule;
// replayEndpoint, if not empty, always binds (as in vLLM).
func newPublisher(endpoint, replayEndpoint, topic string, log *slog.Logger) (*publisher, error) {
	ctx, cancel := context.WithCancel(context.Background())
	p := &publisher{topic: []byte(topic), cancel: cancel, log: log}
	p.pub = zmq4.NewPub(ctx, zmq4.WithDialerMaxRetries(-1))
	if err := p.pub.SetOption(zmq4.OptionHWM, pubHWM); err != nil {
		p.close()
		return nil, fmt.Errorf("kv events publisher: set hwm: %w", err)
	}
	if binds(endpoint) {
		if err := p.pub.Listen(endpoint); err != nil {
			p.close()
			return nil, fmt.Errorf("kv events publisher: bind %s: %w", endpoint, err)
		}
		p.pubAddr = zmtp.Dialable(endpoint, p.pub.Addr())
	} else {
		p.wg.Go(func() {
			if err := p.pub.Dial(endpoint); err != nil && ctx.Err() == nil {
				log.Warn("kv events publisher: connect", "endpoint", endpoint, "err", err)
			}
		})
	}
	if replayEndpoint == "" {
		return p, nil
	}
	p.router = zmq4.NewRouter(ctx)
	if err := p.router.Listen(replayEndpoint); err != nil {
		p.close()
		return nil, fmt.Errorf("kv events replay: bind %s: %w", replayEndpoint, err)
	}
	p.replayAddr = zmtp.Dialable(replayEndpoint, p.router.Addr())
	p.wg.Go(p.serveReplay)
	return p, nil
}

// publish sends one encoded batch with the next sequence number and keeps
// it for replay. It does not block: the PUB queue drops beyond its HWM.
func (p *publisher) publish(payload []byte) {
	p.mu.Lock()
	seq := p.seq
	p.seq++
	if len(p.ring) < ReplayBuffer {
		p.ring = append(p.ring, replayMsg{seq, payload})
	} else {
		p.ring[p.head] = replayMsg{seq, payload}
		p.head = (p.head + 1) % ReplayBuffer
	}
	p.mu.Unlock()
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	if err := p.pub.SendMulti(zmq4.NewMsgFrom(p.topic, s[:], payload)); err != nil {
		p.log.Warn("kv events publish", "seq", seq, "err", err)
	}
}

// since returns the buffered batches with seq >= start, oldest first.
func (p *publisher) since(start uint64) []replayMsg {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []replayMsg
	for i := range p.ring {
		m := p.ring[(p.head+i)%len(p.ring)]
		if m.seq >= start {
			out = append(out, m)
		}
	}
	return out
}

// serveReplay answers replay requests until the ROUTER socket closes.
func (p *publisher) serveReplay() {
	for {
		msg, err := p.router.Recv()
		if err != nil {
			return
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			p.log.Warn("kv events replay: invalid request", "frames", len(msg.Frames))
			continue
		}
		id := msg.Frames[0]
		start := binary.BigEndian.Uint64(msg.Frames[2])
		for _, m := range p.since(start) {
			var s [8]byte
			binary.BigEndian.PutUint64(s[:], m.seq)
			if err := p.router.SendMulti(zmq4.NewMsgFrom(id, nil, p.topic, s[:], m.payload)); err != nil {
				break
			}
		}
		var end [8]byte
		binary.BigEndian.PutUint64(end[:], EndSeq)
		if err := p.router.SendMulti(zmq4.NewMsgFrom(id, nil, nil, end[:], nil)); err != nil {
			p.log.Warn("kv events replay: send", "err", err)
		}
	}
}

// close stops the sockets and joins the publisher's goroutines.
func (p *publisher) close() {
	p.cancel()
	if p.pub != nil {
		p.pub.Close()
	}
	if p.router != nil {
		p.router.Close()
	}
	p.wg.Wait()
}

package kvevents

import (
	"context"
	"encoding/binary"
	"time"

	"github.com/kvrouter/kvrouter/zmtp"
)

// connect owns replica g's SUB connection in connect mode: it dials the
// engine's PUB endpoint, forwards messages to g in order, and on a lost
// connection tells g (continuity is then unknown) and dials again, with
// backoff doubling until a connection carries a message (a publisher
// refused for its frames is not redialled in a tight loop).
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
// reports whether the connection carried a valid message.
func (s *Subscriber) session(ctx context.Context, g *ingester) (delivered bool) {
	c, err := zmtp.Dial(ctx, g.rep.Endpoint, zmtp.Sub, s.cfg.limits())
	if err == nil {
		if err = c.Subscribe(""); err != nil {
			c.Close()
		}
	}
	if err != nil {
		if r, ok := readReason(err); ok {
			s.rej.add(g.log, r, 1, "kv events: publisher refused", "endpoint", g.rep.Endpoint, "err", err)
		} else {
			g.log.Debug("kv events: dial", "endpoint", g.rep.Endpoint, "err", err)
		}
		return false
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	defer c.Close()
	g.bind()
	g.log.Info("kv events: connected", "endpoint", g.rep.Endpoint)
	defer g.unbind(ctx)
	if !g.push(ctx, message{joined: true}) { // replay now, not at the engine's next batch
		return false
	}
	for {
		frames, err := c.Recv()
		if err != nil {
			if r, ok := readReason(err); ok && ctx.Err() == nil {
				s.rej.add(g.log, r, 1, "kv events: publisher connection closed", "endpoint", g.rep.Endpoint, "err", err)
			} else if ctx.Err() == nil {
				g.log.Warn("kv events: connection lost", "endpoint", g.rep.Endpoint, "err", err)
			}
			return delivered
		}
		m, ok := parseMsg(frames)
		if !ok {
			g.c.decodeErrors.Add(1)
			s.rej.add(g.log, RejectMalformed, 1, "kv events: message is not [topic, seq, payload]", "endpoint", g.rep.Endpoint)
			continue
		}
		if s.namesOther(m.topic, g) {
			s.rej.add(g.log, RejectTopic, 1, "kv events: topic names another replica", "endpoint", g.rep.Endpoint, "topic", m.topic)
			continue
		}
		if !g.push(ctx, m) {
			return delivered
		}
		delivered = true
	}
}

// namesOther reports whether topic names a replica other than g (by its
// Addr): an engine publishing for another replica would poison its index.
// A topic naming no configured replica is accepted (an engine's topic
// often carries its pod address, not its service URL).
func (s *Subscriber) namesOther(topic string, g *ingester) bool {
	addr, _, ok := ParseTopic(topic)
	if !ok || addr == g.rep.Addr {
		return false
	}
	o, ok := s.byAnyAddr[addr]
	return ok && o != g
}

// parseMsg reads a live message [topic, seq (8 bytes big-endian), payload].
func parseMsg(f [][]byte) (message, bool) {
	if len(f) != 3 || len(f[1]) != 8 {
		return message{}, false
	}
	return message{
		topic:   string(f[0]),
		seq:     binary.BigEndian.Uint64(f[1]),
		payload: f[2],
		at:      time.Now(),
	}, true
}

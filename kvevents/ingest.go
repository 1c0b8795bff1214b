package kvevents

import (
	"context"
	"log/slog"
	"time"
)

// message is one live message from a replica's publisher, or a note that
// the connection was lost.
type message struct {
	topic   string
	seq     uint64
	payload []byte
	at      time.Time // arrival
	lost    bool      // the connection dropped: continuity is unknown
}

// ingester is one replica's goroutine: it receives the replica's messages
// in order on in and alone owns the sequence state and the chain.
//
// Sequence rules (per publisher). A publisher's baseline is the first
// sequence number it is seen with, whatever it is (vLLM numbers batches
// from 0, llm-d-inference-sim from 1): seq 0, else the first batch of the
// first replay (a late join: the oldest batch still buffered), else the
// first live batch.
//   - seq == next: apply.
//   - seq > next: a gap; replay from next on the ROUTER socket, apply the
//     replayed batches in order, skip the live ones already applied. If
//     replay cannot fill it (no endpoint, an error, or its first batch is
//     past next), reset the replica and go on from the live batch.
//   - seq <= the last live seq: the publisher restarted; reset, and learn
//     its baseline again.
//   - continuity unknown (first message, after a reconnect, after a
//     restart): seq 0 or the baseline is a fresh publisher: reset and
//     apply. Otherwise replay from 0: on first contact, or if the engine
//     still buffers its history from the baseline (a restarted engine
//     does), rebuild from the replay; after a reconnect to the same engine,
//     continue from next if the replay covers it; otherwise reset and go on
//     from the live batch (later blocks whose parents are unknown count as
//     orphans).
type ingester struct {
	rep   Replica
	cfg   *Config
	log   *slog.Logger
	in    chan message
	c     counters
	ch    *chain
	dec   *Decoder
	batch Batch

	next    uint64 // next expected seq, if known
	known   bool   // next is in step with the publisher
	started bool   // something was applied since the last reset
	last    uint64 // last live seq
	hasLast bool
	base    uint64 // the publisher's baseline: the first seq seen from it
	hasBase bool
}

func newIngester(rep Replica, cfg *Config) *ingester {
	return &ingester{
		rep: rep,
		cfg: cfg,
		log: cfg.Logger.With("replica", rep.ID),
		in:  make(chan message, cfg.QueueLen),
		ch:  newChain(rep.ID, rep.Model, cfg.Index, cfg.Now),
		dec: NewDecoder(),
	}
}

// run handles messages until ctx ends.
func (g *ingester) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-g.in:
			g.handle(ctx, m)
		}
	}
}

func (g *ingester) handle(ctx context.Context, m message) {
	if m.lost {
		g.known, g.hasLast = false, false
		return
	}
	if g.rep.Model == "" {
		if _, model, ok := ParseTopic(m.topic); ok {
			g.ch.setModel(model)
		}
	}
	if g.hasLast && m.seq <= g.last {
		g.log.Info("kv events: publisher restarted", "seq", m.seq, "last", g.last)
		g.reset()
		g.hasBase = false
	}
	g.last, g.hasLast = m.seq, true
	switch {
	case !g.known:
		g.resync(ctx, m)
	case m.seq < g.next: // already replayed
	case m.seq == g.next:
		g.apply(m.seq, m.payload, m.at)
	default:
		g.c.gaps.Add(1)
		g.fill(ctx, m)
	}
}

// fill handles a gap [next, m.seq).
func (g *ingester) fill(ctx context.Context, m message) {
	msgs, err := replay(ctx, g.rep.Replay, g.next, g.cfg.ReplayTimeout)
	if err == nil && len(msgs) > 0 && msgs[0].seq <= g.next {
		g.c.replays.Add(1)
		g.applyRun(msgs)
		g.live(m)
		if g.next > m.seq {
			return
		}
	}
	g.log.Warn("kv events: gap not replayed; resetting", "from", g.next, "to", m.seq, "err", err)
	g.reset()
	g.apply(m.seq, m.payload, m.at)
}

// resync handles a message whose continuity with what was applied is
// unknown.
func (g *ingester) resync(ctx context.Context, m message) {
	if m.seq == 0 || g.hasBase && m.seq == g.base { // a fresh publisher
		g.base, g.hasBase = m.seq, true
		g.reset()
		g.apply(m.seq, m.payload, m.at)
		return
	}
	msgs, err := replay(ctx, g.rep.Replay, 0, g.cfg.ReplayTimeout)
	ok := err == nil && len(msgs) > 0 && msgs[0].seq <= m.seq
	switch {
	case ok && (!g.hasBase || msgs[0].seq <= g.base): // history from the baseline: rebuild
		g.base, g.hasBase = msgs[0].seq, true
		g.reset()
		g.c.replays.Add(1)
		g.applyRun(msgs)
		g.live(m)
		if g.next > m.seq {
			return
		}
	case ok && g.started && msgs[0].seq <= g.next && g.next <= m.seq:
		g.c.replays.Add(1) // the same engine after a reconnect
		g.known = true
		g.applyRun(msgs)
		g.live(m)
		if g.next > m.seq {
			return
		}
	}
	if !g.hasBase {
		g.base, g.hasBase = m.seq, true
	}
	g.reset()
	g.apply(m.seq, m.payload, m.at)
}

// live applies m after a replay if it is next.
func (g *ingester) live(m message) {
	if m.seq == g.next {
		g.apply(m.seq, m.payload, m.at)
	}
}

// applyRun applies the replayed batches that continue from next, in order,
// stopping at a hole.
func (g *ingester) applyRun(msgs []replayed) {
	now := time.Now()
	for _, r := range msgs {
		if r.seq < g.next && g.known {
			continue
		}
		if g.known && r.seq > g.next {
			return
		}
		g.apply(r.seq, r.payload, now)
	}
}

// apply decodes one batch fully, then applies it: a batch that does not
// decode changes nothing.
func (g *ingester) apply(seq uint64, payload []byte, at time.Time) {
	g.next, g.known, g.started = seq+1, true, true
	g.c.batches.Add(1)
	if err := g.dec.Decode(payload, &g.batch); err != nil {
		g.c.decodeErrors.Add(1)
		g.log.Debug("kv events: undecodable batch", "seq", seq, "err", err)
		return
	}
	g.c.count(g.ch.apply(&g.batch))
	g.c.blocks.Store(int64(g.ch.Len()))
	g.c.offloaded.Store(int64(g.ch.offloaded))
	g.c.blockSize.Store(int64(g.ch.blockSize))
	g.c.arrived(at)
}

// reset drops the replica's entries (counted if it had any state).
func (g *ingester) reset() {
	if g.started || g.ch.Len() > 0 {
		g.c.resets.Add(1)
	}
	g.ch.clear()
	g.known, g.started = false, false
	g.c.blocks.Store(0)
	g.c.offloaded.Store(0)
}

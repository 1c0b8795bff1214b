package kvevents

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"sync/atomic"
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
	joined  bool      // a connection to the publisher is up (connect mode)
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
//   - a connection up while continuity is unknown (connect mode, before
//     any live batch): replay from 0 at once (join), as below, so that a
//     router joining an idle engine knows its cache before the engine's
//     next batch; an empty or failed replay leaves it to that batch.
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
	rej   *rejects
	hosts []netip.Addr // bind mode: the addresses its engine may publish from
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
	jump    uint64 // an implausible seq seen (more than MaxSeqJump ahead), not yet trusted
	hasJump bool

	queued atomic.Int64 // payload bytes in in, at most Config.MaxQueueBytes

	// cancel ends the replica's goroutines (Stop); stopped is set then.
	cancel  context.CancelFunc
	stopped atomic.Bool
}

func newIngester(rep Replica, cfg *Config, rej *rejects) *ingester {
	return &ingester{
		rep: rep,
		cfg: cfg,
		rej: rej,
		log: cfg.Logger.With("replica", rep.ID),
		in:  make(chan message, cfg.QueueLen),
		ch:  newChain(rep.ID, rep.Model, cfg.Index, cfg.Offloaded, cfg.Now),
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
			g.queued.Add(-int64(len(m.payload)))
			g.handle(ctx, m)
		}
	}
}

func (g *ingester) handle(ctx context.Context, m message) {
	if m.lost {
		g.known, g.hasLast = false, false
		return
	}
	if m.joined {
		g.join(ctx)
		return
	}
	g.topicModel(m.topic)
	if g.implausible(m) {
		return
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

// implausible reports whether m jumps more than MaxSeqJump past the
// expected seq, and so is not applied: a forged or corrupt number must
// not make the replica reset or distrust its real publisher. Only if the
// next message continues from m's seq is the publisher believed to be
// there: the stream is then resynchronised (replay, else a reset).
func (g *ingester) implausible(m message) bool {
	if !g.known || m.seq <= g.next || m.seq-g.next <= g.cfg.MaxSeqJump {
		g.hasJump = false
		return false
	}
	if g.hasJump && m.seq == g.jump+1 {
		g.hasJump = false
		g.known, g.hasLast = false, false
		return false
	}
	g.jump, g.hasJump = m.seq, true
	g.rej.add(g.log, RejectSeqJump, 1, "kv events: sequence jump not trusted", "seq", m.seq, "expected", g.next)
	return true
}

// replayFailed counts a replay refused for its size or framing.
func (g *ingester) replayFailed(err error) {
	r, ok := readReason(err)
	if errors.Is(err, errReplayTooLarge) {
		r, ok = RejectSize, true
	}
	if ok {
		g.rej.add(g.log, r, 1, "kv events: replay refused", "endpoint", g.rep.Replay, "err", err)
	}
}

// offer queues m without waiting (bind mode: one engine's connection
// must not hold up the socket's others). A message that finds the queue
// full, in messages or in bytes (Config.MaxQueueBytes), is dropped and
// counted: a gap, replayed later.
func (g *ingester) offer(m message) {
	if g.stopped.Load() || !g.reserve(m) {
		return
	}
	select {
	case g.in <- m:
	default:
		g.queued.Add(-int64(len(m.payload)))
		g.rej.add(g.log, RejectQueue, 1, "kv events: replica queue full; message dropped", "seq", m.seq, "queue_len", g.cfg.QueueLen)
	}
}

// push queues m, waiting while the queue is full in messages (connect
// mode: back-pressure on the engine's own connection); a message past
// Config.MaxQueueBytes is dropped and counted. It reports false if ctx
// ended.
func (g *ingester) push(ctx context.Context, m message) bool {
	if !g.reserve(m) {
		return true
	}
	select {
	case g.in <- m:
		return true
	case <-ctx.Done():
		return false
	}
}

// reserve counts m's payload into the queue's bytes if it fits.
func (g *ingester) reserve(m message) bool {
	n := int64(len(m.payload))
	if g.queued.Add(n) > g.cfg.MaxQueueBytes && n > 0 {
		g.queued.Add(-n)
		g.rej.add(g.log, RejectQueue, 1, "kv events: replica queue over its byte limit; message dropped", "seq", m.seq,
			"max_queue_bytes", g.cfg.MaxQueueBytes)
		return false
	}
	return true
}

// bind notes a connection now carrying the replica's events.
func (g *ingester) bind() {
	g.c.conns.Add(1)
	g.c.connected.Store(true)
}

// unbind notes the end of a connection that carried the replica's events
// (bind or connect): continuity is unknown from here on.
func (g *ingester) unbind(ctx context.Context) {
	if g.c.conns.Add(-1) <= 0 {
		g.c.connected.Store(false)
	}
	select {
	case g.in <- message{lost: true}:
	case <-ctx.Done():
	}
}

// fill handles a gap [next, m.seq).
func (g *ingester) fill(ctx context.Context, m message) {
	msgs, err := replay(ctx, g.rep.Replay, g.next, g.cfg)
	g.replayFailed(err)
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
	msgs, err := replay(ctx, g.rep.Replay, 0, g.cfg)
	g.replayFailed(err)
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

// join asks for the replay of the publisher's buffered batches as soon
// as a connection is up, when continuity is unknown: on first contact, or
// after a reconnect, the history rebuilds the index (a new baseline) or
// continues it (the same engine, whose replay covers next); anything
// else waits for the first live batch (resync).
func (g *ingester) join(ctx context.Context) {
	if g.known || g.rep.Replay == "" {
		return
	}
	msgs, err := replay(ctx, g.rep.Replay, 0, g.cfg)
	g.replayFailed(err)
	if err != nil || len(msgs) == 0 {
		g.log.Debug("kv events: nothing replayed at connect", "err", err)
		return
	}
	switch {
	case !g.started || !g.hasBase || msgs[0].seq <= g.base:
		g.base, g.hasBase = msgs[0].seq, true
		g.reset()
	case msgs[0].seq <= g.next:
		g.known = true // the same engine after a reconnect
	default:
		return
	}
	g.c.replays.Add(1)
	g.applyRun(msgs)
	g.log.Info("kv events: replayed at connect", "batches", len(msgs), "next", g.next)
}

// live applies m after a replay if it is next.
func (g *ingester) live(m message) {
	if m.seq == g.next {
		g.apply(m.seq, m.payload, m.at)
	}
}

// topicModel keys the chain under the model a batch's topic names, live
// or replayed, when the replica's configuration names none. A replayed
// batch counts as much as a live one: blocks a join replay applied under
// no model would match no request, and the first live batch's topic would
// then drop them.
func (g *ingester) topicModel(topic string) {
	if g.rep.Model != "" {
		return
	}
	if _, model, ok := ParseTopic(topic); ok {
		g.ch.setModel(model)
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
		g.topicModel(r.topic)
		g.apply(r.seq, r.payload, now)
	}
}

// apply decodes one batch fully, then applies it: a batch that does not
// decode changes nothing. The batch is counted last, so a reader that sees
// it in Batches also sees everything it changed.
func (g *ingester) apply(seq uint64, payload []byte, at time.Time) {
	g.next, g.known, g.started = seq+1, true, true
	defer g.c.batches.Add(1)
	if err := g.dec.Decode(payload, &g.batch); err != nil {
		g.c.decodeErrors.Add(1)
		g.log.Debug("kv events: undecodable batch", "seq", seq, "err", err)
		return
	}
	n := g.ch.apply(&g.batch)
	g.c.count(n)
	if n.unknown > 0 {
		g.rej.add(g.log, RejectUnknownRemoval, n.unknown, "kv events: removal of blocks never stored", "seq", seq, "blocks", n.unknown)
	}
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

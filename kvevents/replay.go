package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/kvrouter/kvrouter/zmtp"
)

// EndSeq is the sequence number of the replay end marker (vLLM's
// (-1).to_bytes(8, "big", signed=True)).
const EndSeq uint64 = 0xFFFF_FFFF_FFFF_FFFF

// maxReplay bounds the batches one replay may return (vLLM buffers
// buffer_steps = 10,000 batches).
const maxReplay = 100_000

// errNoReplay is returned when a replica has no replay endpoint.
var errNoReplay = errors.New("no replay endpoint")

// replayed is one batch from the replay socket.
type replayed struct {
	topic   string // empty in the older replies, which carry none
	seq     uint64
	payload []byte
}

// errReplayTooLarge is a replay whose batches add up to more than
// Config.MaxReplayBytes.
var errReplayTooLarge = errors.New("replay too large")

// replay asks the engine's ROUTER socket at endpoint for the buffered
// batches with seq >= start, as vLLM's ZmqEventPublisher serves them: the
// DEALER sends ["", start (8 bytes big-endian)] and reads ["", topic, seq,
// payload] (vLLM >= 0.26) or ["", seq, payload] (older vLLM, SGLang)
// until the end marker seq EndSeq. The whole exchange is bounded by
// cfg.ReplayTimeout, each message by cfg.MaxMessageBytes (checked before
// it is read) and all of them by cfg.MaxReplayBytes. A fresh DEALER per
// request: a restarted engine needs a new connection anyway, and replays
// are rare.
func replay(ctx context.Context, endpoint string, start uint64, cfg *Config) ([]replayed, error) {
	if endpoint == "" {
		return nil, errNoReplay
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.ReplayTimeout)
	defer cancel()
	lim := cfg.limits()
	lim.HandshakeTimeout = min(lim.HandshakeTimeout, cfg.ReplayTimeout)
	d, err := zmtp.Dial(ctx, endpoint, zmtp.Dealer, lim)
	if err != nil {
		return nil, fmt.Errorf("replay %s: %w", endpoint, err)
	}
	defer d.Close()
	stop := context.AfterFunc(ctx, func() { d.Close() })
	defer stop()
	d.SetDeadline(time.Now().Add(cfg.ReplayTimeout))
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], start)
	if err := d.Send([]byte{}, s[:]); err != nil {
		return nil, fmt.Errorf("replay %s: send: %w", endpoint, err)
	}
	var out []replayed
	var total int64
	for {
		f, err := d.Recv()
		if err != nil {
			return out, fmt.Errorf("replay %s: after %d batches: %w", endpoint, len(out), err)
		}
		topic, seq, payload, err := replyFrames(f)
		if err != nil {
			return out, fmt.Errorf("replay %s: %w", endpoint, err)
		}
		if seq == EndSeq {
			return out, nil
		}
		if total += int64(len(payload)); total > cfg.MaxReplayBytes {
			return out, fmt.Errorf("replay %s: %w: more than %d bytes", endpoint, errReplayTooLarge, cfg.MaxReplayBytes)
		}
		if len(out) >= maxReplay {
			return out, fmt.Errorf("replay %s: more than %d batches", endpoint, maxReplay)
		}
		out = append(out, replayed{topic, seq, payload})
	}
}

// replyFrames reads a replay reply: an optional empty delimiter, then
// [topic, seq, payload] or [seq, payload] (topic empty).
func replyFrames(f [][]byte) (topic string, seq uint64, payload []byte, err error) {
	if len(f) > 0 && len(f[0]) == 0 && len(f) >= 3 {
		f = f[1:]
	}
	switch {
	case len(f) == 3 && len(f[1]) == 8:
		return string(f[0]), binary.BigEndian.Uint64(f[1]), f[2], nil
	case len(f) == 2 && len(f[0]) == 8:
		return "", binary.BigEndian.Uint64(f[0]), f[1], nil
	}
	return "", 0, nil, fmt.Errorf("reply of %d frames is neither [topic, seq, payload] nor [seq, payload]", len(f))
}

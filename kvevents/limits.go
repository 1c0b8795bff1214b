package kvevents

import (
	"fmt"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/zmtp"
)

// Limits bound what KV-event sockets may cost the router. Every socket
// is untrusted: a peer can claim any frame size, stall, or forge topics
// and batches. The YAML keys are kvrouter serve's flag names; every zero
// means DefaultLimits' value.
type Limits struct {
	// Allow lists the peers, besides each bind-mode replica's own host
	// (the host of its Addr, resolved at Start), that may publish on the
	// bind socket: CIDRs ("10.0.0.0/8"), IP addresses or host names
	// (resolved at Start), or "*" for any peer. A connection from another
	// host is closed at once; a message for a replica whose host is not
	// the sender's, and that Allow does not admit, is refused. Empty
	// means each replica's own host only.
	Allow AllowList `yaml:"kv-events-allow"`
	// MaxMessageBytes bounds one message (its frames together) from a
	// publisher or a replay socket, checked on each frame header before
	// the frame is read; a larger claim closes the connection.
	MaxMessageBytes int64 `yaml:"kv-events-max-message-bytes"`
	// MaxReplayBytes bounds the payload bytes of one replay.
	MaxReplayBytes int64 `yaml:"kv-events-max-replay-bytes"`
	// MaxQueueBytes bounds the payload bytes queued for one replica
	// (besides Config.QueueLen messages); a message past it is dropped,
	// a gap (replayed).
	MaxQueueBytes int64 `yaml:"kv-events-max-queue-bytes"`
	// MaxConns bounds the bind socket's open connections (one goroutine
	// each); more are closed at once.
	MaxConns int `yaml:"kv-events-max-conns"`
	// HandshakeTimeout bounds a connection's TCP connect (connect mode)
	// and ZMTP greeting and READY exchange.
	HandshakeTimeout time.Duration `yaml:"kv-events-handshake-timeout"`
	// ReadTimeout bounds the reading of one message once its first byte
	// arrived (the wait between messages is not bounded: an idle engine
	// publishes nothing).
	ReadTimeout time.Duration `yaml:"kv-events-read-timeout"`
	// MaxSeqJump is the largest sequence gap taken as lost batches. A
	// batch further ahead is not applied and not trusted as the
	// publisher's new position unless the next batch continues from it
	// (then the replica resynchronises by replay).
	MaxSeqJump uint64 `yaml:"kv-events-max-seq-jump"`
}

// DefaultLimits returns the limits that zero values stand for. The
// default MaxSeqJump is far above the 10,000 batches vLLM buffers for
// replay.
func DefaultLimits() Limits {
	return Limits{
		MaxMessageBytes:  16 << 20,
		MaxReplayBytes:   256 << 20,
		MaxQueueBytes:    64 << 20,
		MaxConns:         256,
		HandshakeTimeout: 5 * time.Second,
		ReadTimeout:      30 * time.Second,
		MaxSeqJump:       1_000_000,
	}
}

// resolved returns l with every zero or negative limit at its default.
func (l Limits) resolved() Limits {
	d := DefaultLimits()
	l.MaxMessageBytes = cmp0(l.MaxMessageBytes, d.MaxMessageBytes)
	l.MaxReplayBytes = cmp0(l.MaxReplayBytes, d.MaxReplayBytes)
	l.MaxQueueBytes = cmp0(l.MaxQueueBytes, d.MaxQueueBytes)
	l.MaxConns = cmp0(l.MaxConns, d.MaxConns)
	l.HandshakeTimeout = cmp0(l.HandshakeTimeout, d.HandshakeTimeout)
	l.ReadTimeout = cmp0(l.ReadTimeout, d.ReadTimeout)
	l.MaxSeqJump = cmp0(l.MaxSeqJump, d.MaxSeqJump)
	return l
}

// limits returns the ZMTP limits of every connection.
func (l *Limits) limits() zmtp.Limits {
	return zmtp.Limits{MaxMessageBytes: l.MaxMessageBytes, MaxFrames: maxFrames,
		HandshakeTimeout: l.HandshakeTimeout, ReadTimeout: l.ReadTimeout}
}

// maxFrames bounds a message's frames: live messages have 3, replay
// replies 4 (with the empty delimiter).
const maxFrames = 8

// cmp0 returns v if positive, else def.
func cmp0[T int | int64 | uint64 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// AllowList is Limits.Allow: peers, written as a comma-separated list
// ("10.0.0.0/8,gw.example"), as a flag (it is a flag.Value) and in YAML
// (a TextUnmarshaler).
type AllowList []string

// String returns the comma-separated list.
func (a AllowList) String() string { return strings.Join(a, ",") }

// Set replaces the list with the comma-separated s, dropping empty items.
func (a *AllowList) Set(s string) error {
	var out AllowList
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	*a = out
	return nil
}

// MarshalText writes the comma-separated list.
func (a AllowList) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// UnmarshalText reads a comma-separated list.
func (a *AllowList) UnmarshalText(b []byte) error {
	if err := a.Set(string(b)); err != nil {
		return fmt.Errorf("kv-events-allow: %w", err)
	}
	return nil
}

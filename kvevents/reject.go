package kvevents

import (
	"errors"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/zmtp"
)

// Reason is why input from an event socket was refused or not trusted;
// the label of kvrouter_kv_events_rejected_total.
type Reason uint8

// Rejection reasons. The set is fixed: the metric's cardinality is
// bounded.
const (
	// RejectPeer is a bind-socket connection from a host that is neither
	// a backend's host nor in Config.Allow; it is closed at once.
	RejectPeer Reason = iota
	// RejectConns is a bind-socket connection refused because
	// Config.MaxConns are open.
	RejectConns
	// RejectHandshake is a connection whose ZMTP greeting or READY was
	// invalid or did not complete within Config.HandshakeTimeout.
	RejectHandshake
	// RejectSize is a connection closed for a frame or message larger
	// than Config.MaxMessageBytes (refused before allocation), or a
	// replay larger than Config.MaxReplayBytes.
	RejectSize
	// RejectTimeout is a connection closed because a message started but
	// did not complete within Config.ReadTimeout.
	RejectTimeout
	// RejectProtocol is a connection closed for a ZMTP framing error.
	RejectProtocol
	// RejectMalformed is a message that is not [topic, 8-byte seq,
	// payload].
	RejectMalformed
	// RejectTopic is a message whose topic names a replica its sender may
	// not publish for: another replica than its connection's (kv=, or a
	// bind connection already bound to one replica), or one whose host
	// is not the sender's.
	RejectTopic
	// RejectUnknownTopic is a bind-socket message whose topic names no
	// replica.
	RejectUnknownTopic
	// RejectSeqJump is a batch whose sequence number is more than
	// Config.MaxSeqJump past the expected one: not applied, and not
	// trusted as the publisher's new position unless the next batch
	// continues from it.
	RejectSeqJump
	// RejectUnknownRemoval is a removed block the replica never stored
	// (per block): it changes nothing.
	RejectUnknownRemoval
	// RejectQueue is a message dropped because its replica's queue was
	// full (Config.QueueLen messages, in bind mode) or held
	// Config.MaxQueueBytes: seen as a gap, replayed later.
	RejectQueue
	numReasons
)

// String is the reason's metric label.
func (r Reason) String() string {
	return [...]string{"peer", "conns", "handshake", "size", "timeout", "protocol", "malformed",
		"topic", "unknown_topic", "seq_jump", "unknown_removal", "queue"}[r]
}

// rejectLogEvery is the least time between two warnings of one reason;
// the ones between are logged at debug level (the counter has them all).
const rejectLogEvery = 10 * time.Second

// rejects counts rejections by reason and logs them without flooding.
type rejects struct {
	n      [numReasons]atomic.Uint64
	logged [numReasons]atomic.Int64 // unix nanoseconds of the last warning
}

// add counts n rejections of reason r and logs msg with args.
func (j *rejects) add(log *slog.Logger, r Reason, n int, msg string, args ...any) {
	j.n[r].Add(uint64(n))
	now := time.Now().UnixNano()
	last := j.logged[r].Load()
	args = append(args, "reason", r.String())
	if now-last >= int64(rejectLogEvery) && j.logged[r].CompareAndSwap(last, now) {
		log.Warn(msg, args...)
		return
	}
	log.Debug(msg, args...)
}

// Rejected returns the rejections of reason r so far.
func (s *Subscriber) Rejected(r Reason) uint64 { return s.rej.n[r].Load() }

// readReason classifies an error that ended a connection's reads, or
// returns false for an ordinary end (EOF, reset, Close).
func readReason(err error) (Reason, bool) {
	switch {
	case errors.Is(err, zmtp.ErrTooLarge):
		return RejectSize, true
	case errors.Is(err, zmtp.ErrProtocol):
		return RejectProtocol, true
	case errors.Is(err, zmtp.ErrHandshake):
		return RejectHandshake, true
	case errors.Is(err, os.ErrDeadlineExceeded):
		return RejectTimeout, true
	}
	return 0, false
}

package kvevents

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/wait"
)

// TestStop: a stopped replica's events no longer reach the index and its
// status is gone, while the other replica's stream goes on.
func TestStop(t *testing.T) {
	p0, p1 := newTestPub(t, "kv@h:1@m", false, false), newTestPub(t, "kv@h:2@m", false, false)
	s, idx := startSub(t, Config{Replicas: []Replica{
		{ID: 0, Model: "m", Endpoint: p0.pubAddr}, {ID: 1, Model: "m", Endpoint: p1.pubAddr}}})
	p0.waitSubscribed()
	p1.waitSubscribed()
	p0.send(0, storedBatch(t, []any{1}, nil, 0), false)
	p1.send(0, storedBatch(t, []any{1}, nil, 0), false)
	wait.For(t, "both first batches", func() bool { return status(t, s, 0).Batches == 1 && status(t, s, 1).Batches == 1 })
	s.Stop(1)
	s.Stop(1) // twice: nothing more
	s.Stop(7) // unknown: ignored
	if _, ok := s.Status(1); ok || s.Healthy(1) {
		t.Error("a stopped replica still has a status")
	}
	held := len(idx.Hashes(1))
	p1.send(1, storedBatch(t, []any{2}, 1, 4), false)
	p0.send(1, storedBatch(t, []any{2}, 1, 4), false)
	wait.For(t, "replica 0's second batch", func() bool { return status(t, s, 0).Batches == 2 })
	time.Sleep(50 * time.Millisecond) // replica 1's batch, were it still read, would be applied by now
	if got := len(idx.Hashes(1)); got != held {
		t.Errorf("replica 1 holds %d blocks after its Stop, want %d (none applied since)", got, held)
	}
	if got := len(idx.Hashes(0)); got != 2 {
		t.Errorf("replica 0 holds %d blocks, want 2", got)
	}
}

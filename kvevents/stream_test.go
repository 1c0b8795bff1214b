package kvevents

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
)

// blocks4 are the router keys of model "m" blocks of 4 tokens from 0.
func blocks4(n int) []prefix.Hash { return keys("m", "", utoks(0, 4*n), 4) }

// TestGaps publishes hand-made batches from a PUB socket: a dropped batch
// is replayed (both reply layouts), a gap without replay or past the
// replay buffer resets the replica.
func TestGaps(t *testing.T) {
	tests := []struct {
		name                    string
		replay, old, overrun    bool
		want                    []prefix.Hash
		batches, gaps, replays  uint64
		resets                  uint64
		orphans, blocksInStatus int
	}{
		{name: "replayed", replay: true, want: blocks4(4), batches: 3, gaps: 1, replays: 1, blocksInStatus: 4},
		{name: "replayed, older layout", replay: true, old: true, want: blocks4(4), batches: 3, gaps: 1, replays: 1, blocksInStatus: 4},
		{name: "no replay endpoint", batches: 2, gaps: 1, resets: 1, orphans: 1},
		{name: "replay buffer overrun", replay: true, overrun: true, batches: 2, gaps: 1, resets: 1, orphans: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newTestPub(t, "kv@h:1@m", tt.replay, tt.old)
			s, idx := startSub(t, Config{Replicas: []Replica{{ID: 0, Model: "m", Endpoint: p.pubAddr, Replay: p.repAddr}}})
			p.waitSubscribed()
			p.send(0, storedBatch(t, []any{1, 2}, nil, 0), false)
			wait.For(t, "seq 0", func() bool { return status(t, s, 0).Batches == 1 })
			p.send(1, storedBatch(t, []any{3}, 2, 8), true) // dropped
			if tt.overrun {
				p.forget(2)
			}
			p.send(2, storedBatch(t, []any{4}, 3, 12), false)
			wait.For(t, "seq 2", func() bool { return status(t, s, 0).Batches == tt.batches })
			st := status(t, s, 0)
			if st.Gaps != tt.gaps || st.Replays != tt.replays || st.Resets != tt.resets || int(st.Orphans) != tt.orphans || st.Blocks != tt.blocksInStatus {
				t.Errorf("status %+v; want gaps %d replays %d resets %d orphans %d blocks %d", st, tt.gaps, tt.replays, tt.resets, tt.orphans, tt.blocksInStatus)
			}
			if d := cmp.Diff(sorted(tt.want), sorted(idx.Hashes(0)), cmpopts.EquateEmpty()); d != "" {
				t.Errorf("index (-want +got):\n%s", d)
			}
		})
	}
}

// TestLateJoin: a subscriber that joins after the publisher's first
// batches rebuilds the index from the replay, asked for at connect (the
// index holds them before the next live batch), whatever number the
// publisher's first batch has (vLLM counts from 0, llm-d-inference-sim
// from 1), with no orphans; a restart at that number is then seen as one.
func TestLateJoin(t *testing.T) {
	tests := []struct {
		first   uint64 // the publisher's first seq
		early   int    // batches published before the subscriber joins
		replays uint64
	}{
		{first: 0, early: 5, replays: 1},
		{first: 1, early: 5, replays: 1},
		{first: 1000, early: 5, replays: 1},
		{first: 0, early: 0, replays: 0}, // seq 0 is a fresh publisher: nothing to replay
		{first: 1, early: 0, replays: 1},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("first=%d,early=%d", tt.first, tt.early), func(t *testing.T) {
			p := newTestPub(t, "kv@h:1@m", true, false)
			for i := range tt.early {
				p.send(tt.first+uint64(i), chainedBatch(t, i), true) // before the join: buffered, not received
			}
			s, idx := startSub(t, Config{Replicas: []Replica{{ID: 0, Model: "m", Endpoint: p.pubAddr, Replay: p.repAddr}}})
			p.waitSubscribed()
			if tt.early > 0 { // replayed at connect, before any live batch
				wait.For(t, "the replay at connect", func() bool { st := status(t, s, 0); return st.Blocks == tt.early && st.BlockSize == 4 })
			} else if got := status(t, s, 0).BlockSize; got != 0 {
				t.Errorf("block size before any batch: got %d, want 0", got)
			}
			p.send(tt.first+uint64(tt.early), chainedBatch(t, tt.early), false)
			wait.For(t, "the join", func() bool { // Blocks is counted last
				st := status(t, s, 0)
				return st.Orphans > 0 || st.Blocks == tt.early+1
			})
			if d := cmp.Diff(sorted(blocks4(tt.early+1)), sorted(idx.Hashes(0))); d != "" {
				t.Errorf("index after the join (-want +got):\n%s", d)
			}
			st := status(t, s, 0)
			checkCounts(t, []count{
				{"orphans", st.Orphans, 0}, {"resets", st.Resets, 0}, {"gaps", st.Gaps, 0},
				{"batches", st.Batches, uint64(tt.early + 1)}, {"replays", st.Replays, tt.replays},
				{"block size", uint64(st.BlockSize), 4},
			})

			p.forget(EndSeq) // the publisher restarts with an empty buffer
			p.send(tt.first, storedBatch(t, []any{7}, nil, 500), false)
			wait.For(t, "the restart", func() bool { return status(t, s, 0).Resets == 1 })
			want := keys("m", "", utoks(500, 4), 4)
			wait.For(t, "the restarted publisher's block", func() bool { return slices.Equal(idx.Hashes(0), want) })
			if got := status(t, s, 0).Orphans; got != 0 {
				t.Errorf("orphans after the restart: got %d, want 0", got)
			}
		})
	}
}

// chainedBatch is the i-th of a chain of single-block batches: engine hash
// i+1 after i, the tokens of blocks4's block i.
func chainedBatch(t *testing.T, i int) []byte {
	var parent any
	if i > 0 {
		parent = i
	}
	return storedBatch(t, []any{i + 1}, parent, 4*i)
}

// TestGarbage: undecodable payloads and malformed messages are counted and
// change nothing; the stream goes on.
func TestGarbage(t *testing.T) {
	p := newTestPub(t, "kv@h:1@m", true, false)
	s, idx := startSub(t, Config{Replicas: []Replica{{ID: 3, Model: "m", Endpoint: p.pubAddr, Replay: p.repAddr}}})
	p.waitSubscribed()
	p.send(0, storedBatch(t, []any{1, 2}, nil, 0), false)
	wait.For(t, "seq 0", func() bool { return status(t, s, 3).Blocks == 2 })
	before := idx.Hashes(3)
	for i, g := range [][]byte{{0xc1}, []byte("not msgpack at all"), pack(t, []any{1.0, []any{[]any{"BlockRemoved", []any{1.5}}}})} {
		p.send(uint64(1+i), g, false)
	}
	p.pub.SendMulti(zmq4.NewMsgFrom([]byte("kv@h:1@m"), []byte{1, 2}, []byte{0x90})) // bad seq frame
	p.send(4, storedBatch(t, []any{3}, 2, 8), false)
	wait.For(t, "seq 4", func() bool { return status(t, s, 3).Batches == 5 })
	st := status(t, s, 3)
	if st.DecodeErrors != 4 || st.Gaps != 0 || st.Resets != 0 {
		t.Errorf("status %+v; want 4 decode errors, no gap, no reset", st)
	}
	if !slices.Equal(before, idx.Hashes(3)[1:]) || idx.Blocks(3) != 3 {
		t.Errorf("index %v, want %v plus block 3", idx.Hashes(3), before)
	}
}

// TestRestartBySeq: a publisher whose sequence goes back restarted; its
// replica is reset before the new batches apply.
func TestRestartBySeq(t *testing.T) {
	p := newTestPub(t, "kv@h:1@m", false, false)
	s, idx := startSub(t, Config{Replicas: []Replica{{ID: 0, Model: "m", Endpoint: p.pubAddr}}})
	p.waitSubscribed()
	p.send(0, storedBatch(t, []any{1, 2}, nil, 0), false)
	p.send(1, storedBatch(t, []any{3}, 2, 8), false)
	wait.For(t, "3 blocks", func() bool { return idx.Blocks(0) == 3 })
	p.send(0, storedBatch(t, []any{7}, nil, 500), false)
	wait.For(t, "the restart", func() bool { return status(t, s, 0).Resets == 1 })
	want := keys("m", "", utoks(500, 4), 4)
	wait.For(t, "the new block", func() bool { return slices.Equal(idx.Hashes(0), want) })
}

// TestStaleAndMetrics: a replica is stale when events the router expects
// do not come, healthy again when they do; the metrics show it.
func TestStaleAndMetrics(t *testing.T) {
	p := newTestPub(t, "kv@h:1@m", false, false)
	s, _ := startSub(t, Config{StaleAfter: 50 * time.Millisecond, Replicas: []Replica{{ID: 2, Model: "m", Endpoint: p.pubAddr}}})
	reg := prometheus.NewRegistry()
	if _, err := NewMetrics(reg, s, nil); err != nil {
		t.Fatal(err)
	}
	p.waitSubscribed()
	wait.For(t, "connected", func() bool { return s.Healthy(2) })
	time.Sleep(100 * time.Millisecond) // twice StaleAfter without events: the behaviour under test
	if !s.Healthy(2) {
		t.Error("an idle replica nobody expects events from is not healthy")
	}
	s.Expect(2)
	wait.For(t, "stale", func() bool { return !s.Healthy(2) })
	if got := gauge(t, reg, "kvrouter_kv_events_stale", "2"); got != 1 {
		t.Errorf("stale gauge %g, want 1", got)
	}
	p.send(0, storedBatch(t, []any{1}, nil, 0), false)
	wait.For(t, "healthy again", func() bool { return s.Healthy(2) })
	if got := gauge(t, reg, "kvrouter_kv_event_blocks_stored_total", "2"); got != 1 {
		t.Errorf("stored blocks %g, want 1", got)
	}
	if got := gauge(t, reg, "kvrouter_kv_events_connected", "2"); got != 1 {
		t.Errorf("connected %g, want 1", got)
	}
	if s.Healthy(99) {
		t.Error("an unknown replica is healthy")
	}
}

// gauge gathers reg and returns the value of name for replica r.
func gauge(t *testing.T, reg *prometheus.Registry, name, r string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.Metric {
			for _, l := range m.Label {
				if l.GetName() == "replica" && l.GetValue() == r {
					if m.Counter != nil {
						return m.Counter.GetValue()
					}
					return m.Gauge.GetValue()
				}
			}
		}
	}
	t.Fatalf("metric %s{replica=%q} missing", name, r)
	return 0
}

func TestParseTopic(t *testing.T) {
	tests := []struct {
		topic, addr, model string
		ok                 bool
	}{
		{"kv@10.0.0.5:8000@Qwen/Qwen3-8B", "10.0.0.5:8000", "Qwen/Qwen3-8B", true},
		{"kv@[::1]:8000@m", "[::1]:8000", "m", true},
		{"kv@host:1@", "host:1", "", true},
		{"", "", "", false},
		{"kv@nohost@m", "", "", false},
		{"other@h:1@m", "", "", false},
	}
	for _, tt := range tests {
		addr, model, ok := ParseTopic(tt.topic)
		if addr != tt.addr || model != tt.model || ok != tt.ok {
			t.Errorf("ParseTopic(%q) = %q, %q, %v; want %q, %q, %v", tt.topic, addr, model, ok, tt.addr, tt.model, tt.ok)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	idx := residency.New(residency.Config{})
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no index", Config{}, "no index"},
		{"duplicate", Config{Index: idx, Replicas: []Replica{{ID: 1, Endpoint: "tcp://h:1"}, {ID: 1, Endpoint: "tcp://h:2"}}}, "twice"},
		{"nowhere", Config{Index: idx, Replicas: []Replica{{ID: 1, Addr: "h:1"}}}, "no endpoint"},
		{"bad bind", Config{Index: idx, Bind: "nope://x"}, "bind"},
	}
	for _, tt := range tests {
		if _, err := Start(tt.cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error %v, want %q", tt.name, err, tt.want)
		}
	}
}

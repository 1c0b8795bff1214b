package kvevents

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/prefix"
)

// startEngine runs an emulated replica serving model "m" for the test.
func startEngine(t *testing.T, cfg emulator.Config) *emulator.Server {
	t.Helper()
	cfg.Preset, cfg.TimeScale, cfg.Model = "llama3-8b-h100", 0.02, "m"
	s, err := emulator.Start(cfg, "127.0.0.1:0")
	if err != nil {
		t.Fatalf("start engine: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// prompt returns n token ids tagged by p (distinct prompts share nothing).
func prompt(p, n int) []uint32 { return utoks(p*10_000+1, n) }

// complete sends one completion of prompt and returns its cached tokens.
func complete(t *testing.T, s *emulator.Server, ids []uint32) int {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"model": "m", "prompt": ids, "max_tokens": 2})
	resp, err := http.Post(s.URL()+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var r struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	return r.Usage.Details.Cached
}

// settle waits until the subscriber has applied every block event the
// engine reported.
func settle(t *testing.T, sub *Subscriber, r int, e *emulator.Server) {
	t.Helper()
	caught := func() bool {
		st, es := status(t, sub, r), e.Stats()
		return es.Running == 0 && es.Waiting == 0 &&
			int64(st.Stored) == es.StoredBlocks && int64(st.Removed) == es.RemovedBlocks
	}
	// The engine's stats are published after its step: hold for 20 ms.
	wait.For(t, "the index to catch up with the engine", func() bool {
		if !caught() {
			return false
		}
		time.Sleep(20 * time.Millisecond) // the stats come after the step: caught twice 20 ms apart
		return caught()
	})
}

// truth returns the router keys of the full blocks of prompts: what the
// router computes from the requests it sent (block size 16).
func truth(prompts ...[]uint32) []prefix.Hash {
	var out []prefix.Hash
	for _, p := range prompts {
		out = append(out, keys("m", "", p, 16)...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func zmqEngine(format string) emulator.Config {
	return emulator.Config{KVEventsEndpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", KVEventsFormat: format}
}

// TestEngineTruth: with either encoding the index ends equal to the
// engine's cache: the keys of the prompts sent (no eviction), as many as
// the engine's cached blocks; both encodings give the same index.
func TestEngineTruth(t *testing.T) {
	var got [][]prefix.Hash
	for _, format := range []string{emulator.FormatArray, emulator.FormatMap} {
		t.Run(format, func(t *testing.T) {
			e := startEngine(t, zmqEngine(format))
			sub, idx := startSub(t, Config{Replicas: []Replica{{ID: 1, Model: "m", Endpoint: e.KVEventsEndpoint(), Replay: e.ReplayEndpoint()}}})
			wait.For(t, "connected", func() bool { return sub.Healthy(1) })
			if bs := status(t, sub, 1).BlockSize; bs != 0 {
				t.Errorf("block size before any BlockStored: got %d, want 0", bs)
			}
			var ps [][]uint32
			for i := range 6 {
				p := append(prompt(0, 64), prompt(i+1, 16*i+5)...) // shared 4-block prefix
				ps = append(ps, p)
				complete(t, e, p)
			}
			settle(t, sub, 1, e)
			want := truth(ps...)
			if d := cmp.Diff(want, sorted(idx.Hashes(1))); d != "" {
				t.Errorf("index vs prompts sent (-want +got):\n%s", d)
			}
			if n := e.Stats().CachedBlocks; idx.Blocks(1) != n {
				t.Errorf("index holds %d blocks, engine %d", idx.Blocks(1), n)
			}
			st := status(t, sub, 1)
			if st.Orphans != 0 || st.DecodeErrors != 0 || st.Resets != 0 || st.Offloaded != 0 {
				t.Errorf("status %+v", st)
			}
			if st.BlockSize != 16 {
				t.Errorf("block size: got %d, want 16", st.BlockSize)
			}
			got = append(got, sorted(idx.Hashes(1)))
		})
	}
	if len(got) == 2 && !slices.Equal(got[0], got[1]) {
		t.Error("the two encodings gave different indexes")
	}
}

// TestEvictionsSeen: with a small cache the engine evicts blocks the
// router did not cause; the index follows: it holds exactly as many
// blocks as the engine, all from prompts sent, and predicts the engine's
// own cached_tokens for the next request.
func TestEvictionsSeen(t *testing.T) {
	cfg := zmqEngine(emulator.FormatMap)
	cfg.KVBlocks = 40
	e := startEngine(t, cfg)
	sub, idx := startSub(t, Config{Replicas: []Replica{{ID: 0, Model: "m", Endpoint: e.KVEventsEndpoint(), Replay: e.ReplayEndpoint()}}})
	wait.For(t, "connected", func() bool { return sub.Healthy(0) })
	var ps [][]uint32
	for round := range 3 {
		for p := range 5 {
			ids := prompt(p, 200)
			if round == 0 {
				ps = append(ps, ids)
			}
			complete(t, e, ids)
		}
	}
	settle(t, sub, 0, e)
	st := status(t, sub, 0)
	if st.Removed == 0 {
		t.Fatal("no evictions seen")
	}
	all := truth(ps...)
	for _, h := range idx.Hashes(0) {
		if _, ok := slices.BinarySearch(all, h); !ok {
			t.Errorf("index holds %x, from no prompt sent", h)
		}
	}
	if n := e.Stats().CachedBlocks; idx.Blocks(0) != n {
		t.Errorf("index holds %d blocks, engine %d", idx.Blocks(0), n)
	}
	for p := range 5 {
		ids := prompt(p, 200)
		predicted := 0
		for _, h := range keys("m", "", ids, 16) {
			if !idx.Has(0, h) {
				break
			}
			predicted++
		}
		if cached := complete(t, e, ids); cached != predicted*16 {
			t.Errorf("prompt %d: engine cached %d tokens, index predicted %d blocks", p, cached, predicted)
		}
		settle(t, sub, 0, e)
	}
}

// TestEngineResetAndRestart: AllBlocksCleared empties the replica's
// entries; a killed engine restarted on the same endpoints is seen as new
// (its replay starts again at 0) and the index holds only its blocks.
func TestEngineResetAndRestart(t *testing.T) {
	pubPort, repPort := freePort(t), freePort(t)
	cfg := emulator.Config{KVEventsEndpoint: fmt.Sprintf("tcp://*:%d", pubPort), ReplayEndpoint: fmt.Sprintf("tcp://*:%d", repPort)}
	e := startEngine(t, cfg)
	sub, idx := startSub(t, Config{Replicas: []Replica{{ID: 0, Model: "m",
		Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", pubPort), Replay: fmt.Sprintf("tcp://127.0.0.1:%d", repPort)}}})
	wait.For(t, "connected", func() bool { return sub.Healthy(0) })
	complete(t, e, prompt(1, 64))
	settle(t, sub, 0, e)
	if idx.Blocks(0) != 4 {
		t.Fatalf("index holds %d blocks, want 4", idx.Blocks(0))
	}
	e.Reset()
	wait.For(t, "the clear", func() bool { return idx.Blocks(0) == 0 && status(t, sub, 0).Resets == 1 })

	complete(t, e, prompt(2, 64))
	wait.For(t, "the blocks after the clear", func() bool { return slices.Equal(sorted(idx.Hashes(0)), truth(prompt(2, 64))) })
	e.Close()
	wait.For(t, "disconnected", func() bool { return !status(t, sub, 0).Connected })
	e2 := startEngine(t, cfg)
	wait.For(t, "reconnected", func() bool { return status(t, sub, 0).Connected })
	complete(t, e2, prompt(3, 32))
	wait.For(t, "the new engine's blocks", func() bool {
		return slices.Equal(sorted(idx.Hashes(0)), truth(prompt(3, 32)))
	})
	if st := status(t, sub, 0); st.Resets != 2 {
		t.Errorf("resets %d, want 2 (clear, restart): %+v", st.Resets, st)
	}
}

// TestBindMode: the router binds one SUB; an engine configured with a
// connect endpoint (no wildcard) dials in and is recognised by its topic
// (its topic names another host: Allow admits loopback).
func TestBindMode(t *testing.T) {
	sub, idx := startSub(t, Config{Bind: "tcp://127.0.0.1:0", Limits: Limits{Allow: AllowList{"127.0.0.0/8"}}, Replicas: []Replica{
		{ID: 4, Addr: "10.0.0.5:8000"}, // model from the topic
		{ID: 5, Addr: "10.0.0.6:8000", Model: "m"},
	}})
	cfg := emulator.Config{KVEventsEndpoint: sub.BindAddr(), Topic: "kv@10.0.0.5:8000@m"}
	e := startEngine(t, cfg)
	// Until the engine's connection is up its events are dropped (PUB
	// semantics): send distinct prompts until one arrives, then clear the
	// engine and check the index follows a workload exactly.
	i := 0
	wait.For(t, "an event through a dialing engine", func() bool {
		if status(t, sub, 4).Batches > 0 {
			return true
		}
		complete(t, e, prompt(i, 32))
		i++
		return false
	})
	e.Reset()
	wait.For(t, "the clear", func() bool { return idx.Blocks(4) == 0 })
	ps := [][]uint32{prompt(1, 64), prompt(2, 48)}
	for _, p := range ps {
		complete(t, e, p)
	}
	wait.For(t, "the workload", func() bool { return slices.Equal(sorted(idx.Hashes(4)), truth(ps...)) })
	if idx.Blocks(4) != e.Stats().CachedBlocks {
		t.Errorf("index holds %d blocks, engine %d", idx.Blocks(4), e.Stats().CachedBlocks)
	}
	if st := status(t, sub, 5); st.Connected || st.Batches != 0 || idx.Blocks(5) != 0 {
		t.Errorf("the other replica got events: %+v", st)
	}
	if st := status(t, sub, 4); !st.Connected || st.DecodeErrors != 0 {
		t.Errorf("bind-mode replica status %+v", st)
	}
}

// TestReplayAtConnect: a router that joins an engine with a history and
// no traffic since asks for the replay at connect: its index holds the
// engine's blocks without waiting for the engine's next batch, which
// then continues it (no reset, no orphan). With no model configured the
// replayed batches are keyed under the model their topic names, as live
// ones are (the next batch's topic does not drop them).
func TestReplayAtConnect(t *testing.T) {
	for _, model := range []string{"m", ""} {
		t.Run("model="+model, func(t *testing.T) {
			e := startEngine(t, zmqEngine(emulator.FormatMap))
			var ps [][]uint32
			for i := range 3 {
				ps = append(ps, prompt(i, 100))
				complete(t, e, ps[i])
			}
			wait.For(t, "the engine idle", func() bool { st := e.Stats(); return st.Running == 0 && st.Waiting == 0 && st.StoredBlocks > 0 })
			sub, idx := startSub(t, Config{Replicas: []Replica{{ID: 0, Model: model, Endpoint: e.KVEventsEndpoint(), Replay: e.ReplayEndpoint()}}})
			wait.For(t, "the engine's history replayed at connect", func() bool { return idx.Blocks(0) == e.Stats().CachedBlocks })
			if d := cmp.Diff(truth(ps...), sorted(idx.Hashes(0))); d != "" {
				t.Errorf("index after the replay vs prompts sent (-want +got):\n%s", d)
			}
			ps = append(ps, prompt(9, 100))
			complete(t, e, ps[3])
			settle(t, sub, 0, e)
			if d := cmp.Diff(truth(ps...), sorted(idx.Hashes(0))); d != "" {
				t.Errorf("index after the next batch (-want +got):\n%s", d)
			}
			if st := status(t, sub, 0); st.Replays != 1 || st.Resets != 0 || st.Orphans != 0 {
				t.Errorf("status %+v, want one replay, no reset, no orphan", st)
			}
		})
	}
}

package emulator

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvrouter/kvrouter/internal/wait"
)

// kvMsg is one message off the PUB socket.
type kvMsg struct {
	topic   string
	seq     uint64
	payload []byte
}

// subscribe connects a SUB socket to the replica's KV events and waits
// until the publisher has seen the subscription.
func subscribe(t *testing.T, s *Server) <-chan kvMsg {
	t.Helper()
	sub := zmq4.NewSub(context.Background())
	if err := sub.Dial(s.KVEventsEndpoint()); err != nil {
		t.Fatalf("dial %s: %v", s.KVEventsEndpoint(), err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		t.Fatal(err)
	}
	pub := s.pub.pub.(zmq4.Topics)
	wait.For(t, "the subscription to reach the publisher", func() bool { return len(pub.Topics()) > 0 })
	return readSub(t, sub)
}

// readSub reads msgs from sub until the test ends.
func readSub(t *testing.T, sub zmq4.Socket) <-chan kvMsg {
	out := make(chan kvMsg, 10_000)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			m, err := sub.Recv()
			if err != nil {
				return
			}
			if len(m.Frames) != 3 || len(m.Frames[1]) != 8 {
				t.Errorf("message with %d frames", len(m.Frames))
				continue
			}
			out <- kvMsg{string(m.Frames[0]), binary.BigEndian.Uint64(m.Frames[1]), m.Frames[2]}
		}
	})
	t.Cleanup(func() { sub.Close(); wg.Wait() })
	return out
}

// recv returns the next message or fails after 5 s.
func recv(t *testing.T, c <-chan kvMsg) kvMsg {
	t.Helper()
	select {
	case m := <-c:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("no KV event message within 5 s")
		return kvMsg{}
	}
}

// kvEvent is a decoded event, whichever its encoding.
type kvEvent struct {
	Type      string
	Hashes    []uint64
	Parent    *uint64
	Tokens    []uint64
	BlockSize int
	Medium    string
	LoRAID    *uint64  // BlockStored's lora_id, nil for the base model
	LoRAName  *string  // BlockStored's lora_name, nil for the base model
	Keys      []string // map keys (map encoding), or nil
}

// decodeBatch decodes [ts, [events], dp_rank] with a generic msgpack
// decode, as an independent check of the encoder.
func decodeBatch(t *testing.T, payload []byte, format string) (float64, []kvEvent) {
	t.Helper()
	var v []any
	if err := msgpack.Unmarshal(payload, &v); err != nil {
		t.Fatalf("decode batch: %v", err)
	}
	if len(v) != 3 {
		t.Fatalf("batch has %d fields, want 3", len(v))
	}
	ts, ok := v[0].(float64)
	if !ok {
		t.Fatalf("ts is %T, want float64", v[0])
	}
	if r := toUint(t, v[2]); r != 0 {
		t.Errorf("data_parallel_rank %d, want 0", r)
	}
	var out []kvEvent
	for _, e := range v[1].([]any) {
		switch format {
		case FormatArray:
			out = append(out, fromArray(t, e.([]any)))
		default:
			out = append(out, fromMap(t, e.(map[string]any)))
		}
	}
	return ts, out
}

func fromArray(t *testing.T, a []any) kvEvent {
	ev := kvEvent{Type: a[0].(string)}
	switch ev.Type {
	case "BlockStored":
		if len(a) != 8 {
			t.Fatalf("BlockStored array of %d, want 8", len(a))
		}
		ev.Hashes, ev.Parent, ev.Tokens = uints(t, a[1]), optUint(t, a[2]), uints(t, a[3])
		ev.BlockSize, ev.Medium = int(toUint(t, a[4])), a[6].(string)
		ev.LoRAID, ev.LoRAName = optUint(t, a[5]), optString(a[7])
	case "BlockRemoved":
		ev.Hashes, ev.Medium = uints(t, a[1]), a[2].(string)
	}
	return ev
}

func fromMap(t *testing.T, m map[string]any) kvEvent {
	ev := kvEvent{Type: m["type"].(string)}
	for k := range m {
		ev.Keys = append(ev.Keys, k)
	}
	slices.Sort(ev.Keys)
	switch ev.Type {
	case "BlockStored":
		ev.Hashes, ev.Parent, ev.Tokens = uints(t, m["block_hashes"]), optUint(t, m["parent_block_hash"]), uints(t, m["token_ids"])
		ev.BlockSize, ev.Medium = int(toUint(t, m["block_size"])), m["medium"].(string)
		ev.LoRAID, ev.LoRAName = optUint(t, m["lora_id"]), optString(m["lora_name"])
	case "BlockRemoved":
		ev.Hashes, ev.Medium = uints(t, m["block_hashes"]), m["medium"].(string)
	}
	return ev
}

// toUint accepts the small int types msgpack decodes into any.
func toUint(t *testing.T, v any) uint64 {
	t.Helper()
	switch x := v.(type) {
	case uint8:
		return uint64(x)
	case uint16:
		return uint64(x)
	case uint32:
		return uint64(x)
	case uint64:
		return x
	case int8:
		return uint64(x)
	case int16:
		return uint64(x)
	case int32:
		return uint64(x)
	case int64:
		return uint64(x)
	}
	t.Fatalf("%v (%T) is not an integer", v, v)
	return 0
}

func optUint(t *testing.T, v any) *uint64 {
	if v == nil {
		return nil
	}
	u := toUint(t, v)
	return &u
}

func optString(v any) *string {
	if v == nil {
		return nil
	}
	s := v.(string)
	return &s
}

func uints(t *testing.T, v any) []uint64 {
	var out []uint64
	for _, x := range v.([]any) {
		out = append(out, toUint(t, x))
	}
	return out
}

// collect reads batches until cond holds on the events so far.
func collect(t *testing.T, c <-chan kvMsg, format string, cond func([]kvEvent) bool) ([]kvMsg, []kvEvent) {
	t.Helper()
	var msgs []kvMsg
	var evs []kvEvent
	for !cond(evs) {
		m := recv(t, c)
		msgs = append(msgs, m)
		_, es := decodeBatch(t, m.payload, format)
		evs = append(evs, es...)
	}
	return msgs, evs
}

func count(evs []kvEvent, typ string) (n int) {
	for _, e := range evs {
		if e.Type == typ {
			n += max(len(e.Hashes), 1)
		}
	}
	return n
}

func zmqConfig(format string) Config {
	return Config{KVEventsEndpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", KVEventsFormat: format}
}

func TestKVEventsBothEncodings(t *testing.T) {
	tests := []struct {
		format string
		keys   []string // map keys of BlockStored; nil for arrays
	}{
		{FormatArray, nil},
		{FormatMap, []string{"block_hashes", "block_size", "extra_keys", "group_idx", "lora_id",
			"lora_name", "medium", "parent_block_hash", "token_ids", "type"}},
	}
	for _, tt := range tests {
		t.Run(tt.format, func(t *testing.T) {
			s := start(t, zmqConfig(tt.format))
			c := subscribe(t, s)
			prompt := make([]uint32, 5*16+3)
			for i := range prompt {
				prompt[i] = uint32(1000 + i)
			}
			t0 := float64(time.Now().UnixNano()) / 1e9
			if code, b := post(t, s.URL()+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2}); code != 200 {
				t.Fatalf("status %d: %s", code, b)
			}
			msgs, evs := collect(t, c, tt.format, func(e []kvEvent) bool { return count(e, "BlockStored") >= 5 })
			for i, m := range msgs {
				if m.topic != s.Topic() || m.seq != uint64(i) {
					t.Errorf("message %d: topic %q seq %d, want %q %d", i, m.topic, m.seq, s.Topic(), i)
				}
			}
			if ts, _ := decodeBatch(t, msgs[0].payload, tt.format); ts < t0-1 || ts > t0+60 {
				t.Errorf("ts %f, want about %f", ts, t0)
			}
			var hashes, tokens []uint64
			for i, e := range evs {
				if e.Type != "BlockStored" || e.BlockSize != 16 || e.Medium != "GPU" {
					t.Errorf("event %d: %+v", i, e)
				}
				if i == 0 && e.Parent != nil {
					t.Errorf("first block's parent %d, want nil", *e.Parent)
				}
				if i > 0 && (e.Parent == nil || *e.Parent != hashes[len(hashes)-1]) {
					t.Errorf("event %d: parent %v does not chain to %d", i, e.Parent, hashes[len(hashes)-1])
				}
				if tt.keys != nil && !slices.Equal(e.Keys, tt.keys) {
					t.Errorf("map keys %v, want %v", e.Keys, tt.keys)
				}
				hashes, tokens = append(hashes, e.Hashes...), append(tokens, e.Tokens...)
			}
			if len(hashes) != 5 || len(tokens) != 80 {
				t.Fatalf("%d hashes and %d tokens, want 5 and 80", len(hashes), len(tokens))
			}
			for i, tok := range tokens {
				if tok != uint64(prompt[i]) {
					t.Fatalf("token %d: %d, want %d", i, tok, prompt[i])
				}
			}
		})
	}
}

// workload sends rounds × prompts of n tokens, one at a time, and returns
// the cached tokens of each response.
func workload(t *testing.T, s *Server, rounds, prompts, n int) []int {
	var cached []int
	for r := range rounds {
		for p := range prompts {
			ids := make([]uint32, n)
			for i := range ids {
				ids[i] = uint32(p*10_000 + i)
			}
			code, b := post(t, s.URL()+"/v1/completions", map[string]any{"prompt": ids, "max_tokens": 2})
			if code != 200 {
				t.Fatalf("round %d prompt %d: status %d: %s", r, p, code, b)
			}
			cached = append(cached, decodeResponse(t, b).Usage.PromptTokensDetails.CachedTokens)
		}
	}
	return cached
}

func TestFullCacheEvictsAndHitsLess(t *testing.T) {
	hitRate := func(s *Server) float64 {
		m := scrape(t, s.URL())
		return metric(t, m, "vllm:prefix_cache_hits_total") / metric(t, m, "vllm:prefix_cache_queries_total")
	}
	big := start(t, Config{KVBlocks: 1000})
	workload(t, big, 3, 5, 200)

	cfg := zmqConfig(FormatMap)
	cfg.KVBlocks = 40 // 640 tokens: room for three 200-token prompts
	small := start(t, cfg)
	c := subscribe(t, small)
	workload(t, small, 3, 5, 200)
	_, evs := collect(t, c, FormatMap, func(e []kvEvent) bool { return count(e, "BlockRemoved") > 0 })
	stored := map[uint64]bool{}
	for _, e := range evs {
		if e.Type == "BlockStored" {
			for _, h := range e.Hashes {
				stored[h] = true
			}
		}
	}
	for _, e := range evs {
		if e.Type != "BlockRemoved" {
			continue
		}
		if e.Medium != "GPU" || len(e.Hashes) == 0 {
			t.Errorf("BlockRemoved %+v", e)
		}
		for _, h := range e.Hashes {
			if !stored[h] {
				t.Errorf("removed block %d was never stored", h)
			}
		}
	}
	hb, hs := hitRate(big), hitRate(small)
	if hb < 0.5 || hs >= hb {
		t.Errorf("hit rate: big cache %.2f, small cache %.2f; want the small one lower", hb, hs)
	}
	t.Logf("hit rate: 1000 blocks %.2f, 40 blocks %.2f", hb, hs)
}

func TestReplay(t *testing.T) {
	for _, format := range []string{FormatMap, FormatArray} {
		t.Run(format, func(t *testing.T) {
			s := start(t, zmqConfig(format))
			c := subscribe(t, s)
			workload(t, s, 1, 3, 40) // 3 prompts of 2 full blocks: 3 batches
			live, _ := collect(t, c, format, func(e []kvEvent) bool { return count(e, "BlockStored") >= 6 })

			d := zmq4.NewDealer(context.Background())
			defer d.Close()
			if err := d.Dial(s.ReplayEndpoint()); err != nil {
				t.Fatalf("dial replay %s: %v", s.ReplayEndpoint(), err)
			}
			tests := []struct {
				start uint64
				want  []kvMsg
			}{
				{0, live},
				{1, live[1:]},
				{uint64(len(live)), nil},
			}
			for _, tt := range tests {
				var seq [8]byte
				binary.BigEndian.PutUint64(seq[:], tt.start)
				if err := d.SendMulti(zmq4.NewMsgFrom(nil, seq[:])); err != nil {
					t.Fatal(err)
				}
				var got []kvMsg
				for {
					m, err := d.Recv()
					if err != nil {
						t.Fatal(err)
					}
					if len(m.Frames) != 4 || len(m.Frames[0]) != 0 || len(m.Frames[2]) != 8 {
						t.Fatalf("replay reply with frames %q", m.Frames)
					}
					s := binary.BigEndian.Uint64(m.Frames[2])
					if s == EndSeq {
						if len(m.Frames[1]) != 0 || len(m.Frames[3]) != 0 {
							t.Errorf("end marker %q, want empty topic and payload", m.Frames)
						}
						break
					}
					got = append(got, kvMsg{string(m.Frames[1]), s, m.Frames[3]})
				}
				if len(got) != len(tt.want) {
					t.Fatalf("start %d: %d batches, want %d", tt.start, len(got), len(tt.want))
				}
				for i := range got {
					w := tt.want[i]
					if got[i].topic != w.topic || got[i].seq != w.seq || string(got[i].payload) != string(w.payload) {
						t.Errorf("start %d: batch %d: topic %q seq %d, want %q %d (or payload differs)",
							tt.start, i, got[i].topic, got[i].seq, w.topic, w.seq)
					}
				}
			}
		})
	}
}

func TestResetClearsCache(t *testing.T) {
	s := start(t, zmqConfig(FormatArray))
	c := subscribe(t, s)
	if got := workload(t, s, 2, 1, 64); got[1] == 0 {
		t.Fatalf("before reset: cached %v, want a hit on the repeat", got)
	}
	collect(t, c, FormatArray, func(e []kvEvent) bool { return count(e, "BlockStored") >= 4 })
	s.Reset()
	_, evs := collect(t, c, FormatArray, func(e []kvEvent) bool { return len(e) > 0 })
	if evs[0].Type != "AllBlocksCleared" {
		t.Errorf("after Reset: %+v, want AllBlocksCleared", evs[0])
	}
	if got := workload(t, s, 1, 1, 64); got[0] != 0 {
		t.Errorf("after reset: cached %d, want 0", got[0])
	}
}

func TestPublisherConnects(t *testing.T) {
	// A router that binds its SUB and lets engines dial in (vLLM's
	// "connect" side: an endpoint without a wildcard).
	sub := zmq4.NewSub(context.Background())
	if err := sub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	sub.SetOption(zmq4.OptionSubscribe, "")
	c := readSub(t, sub)
	ep := fmt.Sprintf("tcp://%s", sub.Addr())
	s := start(t, Config{KVEventsEndpoint: ep})
	if s.KVEventsEndpoint() != "" {
		t.Errorf("KVEventsEndpoint %q for a connecting publisher, want empty", s.KVEventsEndpoint())
	}
	// Until the connection and subscription are up, events are dropped (PUB
	// semantics): send distinct prompts until one arrives.
	i := 0
	wait.For(t, "an event through a connecting publisher", func() bool {
		select {
		case m := <-c:
			if m.topic != s.Topic() {
				t.Errorf("topic %q, want %q", m.topic, s.Topic())
			}
			return true
		default:
		}
		workload(t, s, 1, 1, 16+i)
		i++
		return false
	})
}

func TestBinds(t *testing.T) {
	tests := []struct {
		ep   string
		want bool
	}{
		{"tcp://*:5557", true},
		{"tcp://127.0.0.1:*", true},
		{"tcp://[::]:5557", true},
		{"tcp://127.0.0.1:0", true},
		{"ipc:///tmp/kv", true},
		{"inproc://kv", true},
		{"tcp://10.0.0.5:5557", false},
		{"tcp://router.local:5557", false},
	}
	for _, tt := range tests {
		if got := binds(tt.ep); got != tt.want {
			t.Errorf("binds(%q) = %v, want %v", tt.ep, got, tt.want)
		}
	}
}

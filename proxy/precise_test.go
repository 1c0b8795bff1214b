package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/hashing"
	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
)

// eventEngine starts one emulated replica of model "m" publishing KV events
// (map encoding) with replay, on loopback; addr "" means a random port.
func eventEngine(t *testing.T, kvBlocks int, addr, pub, replay string) *emulator.Server {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	if pub == "" {
		pub, replay = "tcp://127.0.0.1:*", "tcp://127.0.0.1:*"
	}
	s, err := emulator.Start(emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: 0.01, KVBlocks: kvBlocks,
		KVEventsEndpoint: pub, ReplayEndpoint: replay}, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// preciseRouter starts a kv-aware router in token mode (remote: the
// emulators' /tokenize) following the engines' events.
func preciseRouter(t *testing.T, backends []Backend) (*Router, string) {
	t.Helper()
	rt, url := startRouter(t, "kv-aware", func(c *Config) {
		c.Backends = backends
		c.Tokenizer = Remote
		c.HealthInterval = 20 * time.Millisecond
		c.ScrapeInterval = 20 * time.Millisecond
	})
	runRouter(t, rt)
	return rt, url
}

func eventBackend(s *emulator.Server) Backend {
	return Backend{URL: s.URL(), KV: s.KVEventsEndpoint(), Replay: s.ReplayEndpoint()}
}

// preciseReady waits until replica i is matched against the precise index
// and its block size is known: in token mode a request is matched and
// tracked only then, and the events can connect before the first scrape
// reads the block size from the replica's metrics.
func preciseReady(t *testing.T, rt *Router, i int) {
	t.Helper()
	wait.For(t, "precise mode and the block size", func() bool {
		return rt.st.fleet.IndexMode(i) == IndexPrecise && rt.View(time.Now()).Replicas[i].BlockSize > 0
	})
}

// settled waits until replica i's engine is idle and the router applied
// every block event it published: the router's stored and removed block
// counts equal the engine's, or, once the stream went through a replay, a
// reset or orphans (after which those counts no longer add up: a rebuild
// from the replay buffer counts its blocks again, a removal of a block
// the router never saw is not counted), the blocks the router knows equal
// the engine's cached blocks. Either must hold twice, 20 ms apart, with
// the engine's counters unchanged, so that no batch is still on its way.
// On a timeout it reports both sides.
func settled(t *testing.T, rt *Router, i int, e *emulator.Server) {
	t.Helper()
	type sides struct {
		st kvevents.Status
		es engine.Stats
	}
	read := func() (sides, bool) {
		st, ok := rt.st.feed.sub.Status(i)
		es := e.Stats()
		s := sides{st, es}
		if !ok || es.Running != 0 || es.Waiting != 0 {
			return s, false
		}
		exact := int64(st.Stored) == es.StoredBlocks && int64(st.Removed) == es.RemovedBlocks
		recounted := (st.Replays > 0 || st.Resets > 0 || st.Orphans > 0) && st.Blocks == es.CachedBlocks
		return s, exact || recounted
	}
	wait.For(t, fmt.Sprintf("replica %d's events to be applied", i), func() bool {
		a, ok := read()
		if !ok {
			return false
		}
		// The engine publishes its stats after the step, and no counter
		// says it did: two reads a quiet period apart that agree are the
		// condition.
		time.Sleep(20 * time.Millisecond)
		b, ok := read()
		return ok && b.es.StoredBlocks == a.es.StoredBlocks && b.es.RemovedBlocks == a.es.RemovedBlocks
	})
}

// chatKeys is what the engine caches for a chat: the router keys of the
// full blocks of its rendering under the emulator's tokenizer.
func chatKeys(msgs []chatMsg) []prefix.Hash {
	ms := make([]emulator.Message, len(msgs))
	for i, m := range msgs {
		ms[i] = emulator.Message{Role: m.Role, Content: m.Content}
	}
	return prefix.Blocks(prefix.Root("m", ""), emulator.Tokenize(emulator.RenderChat(ms, true)), 16, nil)
}

func textKeys(text string) []prefix.Hash {
	return prefix.Blocks(prefix.Root("m", ""), emulator.Tokenize(text), 16, nil)
}

func sortedSet(hs []prefix.Hash) []prefix.Hash {
	out := slices.Clone(hs)
	slices.Sort(out)
	return slices.Compact(out)
}

// TestPreciseIndexEqualsEngines: conversations through a precise router;
// after the workload each replica's precise index equals the blocks of the
// prompts its engine served (its true cache: no evictions), block for
// block, and the router predicted every turn's cached tokens exactly.
func TestPreciseIndexEqualsEngines(t *testing.T) {
	engines := []*emulator.Server{eventEngine(t, 0, "", "", ""), eventEngine(t, 0, "", "", "")}
	rt, url := preciseRouter(t, []Backend{eventBackend(engines[0]), eventBackend(engines[1])})
	for i := range engines {
		preciseReady(t, rt, i)
	}
	truth := make([][]prefix.Hash, len(engines))
	byURL := map[string]int{engines[0].URL(): 0, engines[1].URL(): 1}
	for conv := range 6 {
		msgs := []chatMsg{{"system", "You are terse. " + words(conv, 30)}}
		for turn := range 3 {
			msgs = append(msgs, chatMsg{"user", words(conv*10+turn, 40)})
			b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "max_tokens": 4})
			resp, body := do(t, "POST", url+"/v1/chat/completions", string(b), "X-Session-ID", fmt.Sprint("s", conv))
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			i := byURL[resp.Header.Get(HeaderReplica)]
			truth[i] = append(truth[i], chatKeys(msgs)...)
			var r chatResp
			json.Unmarshal([]byte(body), &r)
			msgs = append(msgs, r.Choices[0].Message)
		}
	}
	for i, e := range engines {
		settled(t, rt, i, e)
		got := sortedSet(rt.st.fleet.Tracker().Precise().Hashes(i))
		if d := cmp.Diff(sortedSet(truth[i]), got, cmpopts.EquateEmpty()); d != "" { // kv-aware may leave a replica idle
			t.Errorf("replica %d: precise index vs the engine's cache (-want +got):\n%s", i, d)
		}
		if n := e.Stats().CachedBlocks; len(got) != n {
			t.Errorf("replica %d: index holds %d blocks, engine %d", i, len(got), n)
		}
	}
	recs := rt.Decisions(100)
	if len(recs) != 18 {
		t.Fatalf("%d records, want 18", len(recs))
	}
	for _, r := range recs {
		if r.Index != IndexPrecise || r.ActualCached < 0 {
			t.Errorf("record %s: index %q actual %d; want precise, reported", r.ID, r.Index, r.ActualCached)
		}
		if r.PredictedCached != r.ActualCached {
			t.Errorf("record %s: predicted %d cached tokens, engine %d", r.ID, r.PredictedCached, r.ActualCached)
		}
	}
	v := rt.View(time.Now())
	if v.Index != IndexPrecise || v.Hash != hashing.ModeTokens {
		t.Errorf("view index %q hash %q, want precise tokens", v.Index, v.Hash)
	}
	for i, r := range v.Replicas {
		k := r.Events
		served := len(truth[i]) > 0
		if k == nil || !k.Followed || !k.Connected || k.Fallback || served && (k.Events == 0 || k.LastEvent < 0) || r.IndexMode != IndexPrecise {
			t.Errorf("replica %d view: mode %q kv events %+v", i, r.IndexMode, k)
		}
		if r.IndexBlocks != engines[i].Stats().CachedBlocks {
			t.Errorf("replica %d view: index blocks %d, engine %d", i, r.IndexBlocks, engines[i].Stats().CachedBlocks)
		}
	}
}

// TestPreciseSeesOtherTraffic: traffic sent straight to the engine,
// bypassing the router, evicts the blocks the router routed there; the
// router's index follows: it holds the bypassing prompts' blocks, drops
// the evicted ones, and predicts no cache for the evicted prompt.
func TestPreciseSeesOtherTraffic(t *testing.T) {
	e := eventEngine(t, 40, "", "", "")
	rt, url := preciseRouter(t, []Backend{eventBackend(e)})
	preciseReady(t, rt, 0)
	routed := words(1, 150)
	complete := func(base, prompt string) int {
		b, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": 2})
		resp, body := do(t, "POST", base+"/v1/completions", string(b))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		var r chatResp
		json.Unmarshal([]byte(body), &r)
		return r.Usage.PromptTokensDetails.CachedTokens
	}
	complete(url, routed)
	settled(t, rt, 0, e)
	if !rt.st.fleet.Tracker().Precise().Has(0, textKeys(routed)[0]) {
		t.Fatal("routed prompt's first block not in the index")
	}
	var direct []string
	for k := range 5 {
		direct = append(direct, words(100+k, 150))
		complete(e.URL(), direct[k])
	}
	settled(t, rt, 0, e)
	x := rt.st.fleet.Tracker().Precise()
	if x.Has(0, textKeys(routed)[0]) {
		t.Error("the evicted routed prompt is still in the index")
	}
	last := textKeys(direct[4])
	for _, h := range last {
		if !x.Has(0, h) {
			t.Errorf("block %x of the last direct prompt missing from the index", h)
		}
	}
	if x.Blocks(0) != e.Stats().CachedBlocks || e.Stats().RemovedBlocks == 0 {
		t.Errorf("index %d blocks, engine %d cached, %d removed", x.Blocks(0), e.Stats().CachedBlocks, e.Stats().RemovedBlocks)
	}
	// The overlay of the routed request has expired by now only if the
	// test ran long; match from the precise index alone.
	m := make([]int, 1)
	x.Match(textKeys(direct[4]), time.Since(rt.start), m, nil)
	if m[0] != len(last) {
		t.Errorf("index matches %d blocks of the last direct prompt, want %d", m[0], len(last))
	}
}

// TestPreciseLearnsDisplaced: in precise mode a match has no age, yet the
// router learns what a replica evicted that was asked for again. Two
// routed requests store more than the replica's cache holds (their
// output counts too); traffic sent straight to the engine then evicts the
// first prompt (the engine's BlockRemoved events say so, while the
// router's own record of what it sent still holds it); when that prompt
// comes back through the router, after the just-routed overlay lapsed,
// the replica's Displaced is above 0.
func TestPreciseLearnsDisplaced(t *testing.T) {
	e := eventEngine(t, 40, "", "", "")
	rt, url := preciseRouter(t, []Backend{eventBackend(e)})
	preciseReady(t, rt, 0)
	complete := func(base, prompt string, out int) {
		b, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": out, "ignore_eos": true})
		if resp, body := do(t, "POST", base+"/v1/completions", string(b)); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
	}
	displaced := func() float64 {
		var s route.Snapshot
		rt.st.fleet.Snapshot(&s, time.Now(), 0)
		return s.Replicas[0].Rates.Displaced
	}
	first := words(1, 40)
	complete(url, first, 300)
	complete(url, words(2, 40), 300)
	for k := range 3 {
		complete(e.URL(), words(100+k, 150), 2)
	}
	settled(t, rt, 0, e)
	if rt.st.fleet.Tracker().Precise().Has(0, textKeys(first)[0]) || e.Stats().RemovedBlocks == 0 {
		t.Fatalf("the first prompt was not evicted (%d blocks removed)", e.Stats().RemovedBlocks)
	}
	if d := displaced(); d != 0 {
		t.Fatalf("Displaced %.3f before anything evicted was asked for again, want 0", d)
	}
	// The overlay's entries expiring with time is the behaviour under
	// test: the evicted prefix must be asked for again after its TTL.
	time.Sleep(residency.DefaultOverlayTTL + 100*time.Millisecond)
	complete(url, first, 2)
	wait.For(t, "Displaced learned", func() bool { return displaced() > 0 })
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestPreciseEngineRestart: an engine that dies falls back to approximate
// tracking (visible in the view and the metrics); restarted on the same
// endpoints it is reset in the index, which then holds only the new
// engine's blocks, and the replica is precise again.
func TestPreciseEngineRestart(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	pub, rep := freePort(t), freePort(t)
	bind := func(p int) string { return fmt.Sprintf("tcp://*:%d", p) }
	dial := func(p int) string { return fmt.Sprintf("tcp://127.0.0.1:%d", p) }
	e := eventEngine(t, 0, addr, bind(pub), bind(rep))
	rt, url := startRouter(t, "kv-aware", func(c *Config) {
		c.Backends = []Backend{{URL: e.URL(), KV: dial(pub), Replay: dial(rep)}}
		c.Tokenizer = Remote
		c.HealthInterval = 20 * time.Millisecond
	})
	runRouter(t, rt)
	preciseReady(t, rt, 0)
	body := `{"model":"m","max_tokens":2,"prompt":"` + words(7, 100) + `"}`
	if resp, out := do(t, "POST", url+"/v1/completions", body); resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	settled(t, rt, 0, e)
	if rt.st.fleet.Tracker().Precise().Blocks(0) == 0 {
		t.Fatal("no blocks indexed")
	}
	e.Close()
	wait.For(t, "the fallback", func() bool {
		v := rt.View(time.Now()).Replicas[0]
		return v.IndexMode == IndexApproximate && v.Events.Fallback && !v.Events.Connected
	})
	if got := gauge(t, rt, "kvrouter_index_mode", e.URL(), IndexApproximate); got != 1 {
		t.Errorf("kvrouter_index_mode approximate = %v, want 1", got)
	}
	e2 := eventEngine(t, 0, addr, bind(pub), bind(rep))
	wait.For(t, "precise again", func() bool { return rt.st.fleet.IndexMode(0) == IndexPrecise })
	direct := words(8, 60)
	b, _ := json.Marshal(map[string]any{"model": "m", "prompt": direct, "max_tokens": 2})
	if resp, out := do(t, "POST", e2.URL()+"/v1/completions", string(b)); resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	wait.For(t, "the new engine's blocks only", func() bool {
		return slices.Equal(sortedSet(rt.st.fleet.Tracker().Precise().Hashes(0)), sortedSet(textKeys(direct)))
	})
	v := rt.View(time.Now()).Replicas[0]
	if v.Events.Resets == 0 {
		t.Errorf("view: %+v, want a reset", v.Events)
	}
	if got := gauge(t, rt, "kvrouter_index_mode", e.URL(), IndexPrecise); got != 1 {
		t.Errorf("kvrouter_index_mode precise = %v, want 1", got)
	}
}

// TestPreciseFallbackDeadEndpoint: a replica whose kv= endpoint answers
// nothing is tracked approximately, visibly (view, metrics, decision
// records), while the other replica is precise.
func TestPreciseFallbackDeadEndpoint(t *testing.T) {
	good, bad := eventEngine(t, 0, "", "", ""), eventEngine(t, 0, "", "", "")
	dead := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	rt, url := preciseRouter(t, []Backend{eventBackend(good), {URL: bad.URL(), KV: dead}})
	wait.For(t, "replica 0 precise", func() bool { return rt.st.fleet.IndexMode(0) == IndexPrecise })
	// In token mode a replica is matched (and tracked) only once its block
	// size is known: from its metrics, here.
	wait.For(t, "block sizes known", func() bool { return rt.View(time.Now()).Replicas[1].BlockSize > 0 })
	v := rt.View(time.Now())
	if r := v.Replicas[1]; r.IndexMode != IndexApproximate || r.Events == nil || !r.Events.Fallback || r.Events.Connected {
		t.Errorf("dead-endpoint replica: mode %q kv events %+v", r.IndexMode, r.Events)
	}
	checks := []struct {
		name, replica, mode string
		want                float64
	}{
		{"kvrouter_index_mode", good.URL(), IndexPrecise, 1},
		{"kvrouter_index_mode", bad.URL(), IndexPrecise, 0},
		{"kvrouter_index_mode", bad.URL(), IndexApproximate, 1},
		{"kvrouter_kv_events_connected", bad.URL(), "", 0},
		{"kvrouter_kv_events_stale", bad.URL(), "", 1},
		{"kvrouter_kv_events_connected", good.URL(), "", 1},
		{"kvrouter_kv_events_stale", good.URL(), "", 0},
	}
	for _, c := range checks {
		if got := gauge(t, rt, c.name, c.replica, c.mode); got != c.want {
			t.Errorf("%s{replica=%s,mode=%s} = %v, want %v", c.name, c.replica, c.mode, got, c.want)
		}
	}
	// Every KV-event series names its replica by URL, as the other router
	// metrics do.
	mfs, err := rt.gatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := 0
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "kvrouter_kv_event") {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "replica" && l.GetValue() != good.URL() && l.GetValue() != bad.URL() {
					t.Errorf("%s{replica=%q}: want a backend URL", mf.GetName(), l.GetValue())
				}
			}
			series++
		}
	}
	if want := 2*13 + 1 + 12; series != want {
		t.Errorf("%d kv-event series, want %d (13 per replica, unmatched, 12 rejection reasons)", series, want)
	}
	seen := map[string]bool{}
	for k := 0; k < 40 && len(seen) < 2; k++ {
		body := fmt.Sprintf(`{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"%s"}]}`, words(k, 40))
		resp, out := do(t, "POST", url+"/v1/chat/completions", body, "X-Session-ID", fmt.Sprint("s", k))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, out)
		}
		rec := rt.Decisions(1)[0]
		want := IndexPrecise
		if rec.Replica == bad.URL() {
			want = IndexApproximate
		}
		if rec.Index != want {
			t.Errorf("decision on %s: index %q, want %q", rec.Replica, rec.Index, want)
		}
		seen[rec.Replica] = true
	}
	// The approximate index of the fallback replica is fed by routing.
	if held, _ := rt.st.fleet.Tracker().Blocks(1); held == 0 && seen[bad.URL()] {
		t.Error("fallback replica's approximate index is empty after routing to it")
	}
}

// gauge reads one sample of the router's metrics: name with label
// replica (and mode, when not empty).
func gauge(t *testing.T, rt *Router, name, replica, mode string) float64 {
	t.Helper()
	mfs, err := rt.gatherer.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["replica"] == replica && (mode == "" || labels["mode"] == mode) {
				if m.Gauge != nil {
					return m.Gauge.GetValue()
				}
				return m.Counter.GetValue()
			}
		}
	}
	t.Fatalf("no sample %s{replica=%q,mode=%q}", name, replica, mode)
	return 0
}

// TestRemoteTokenizeMemo: a repeated request costs no /tokenize round
// trip; a new turn costs one; the router's hashes are the engine's.
func TestRemoteTokenizeMemo(t *testing.T) {
	e := eventEngine(t, 0, "", "", "")
	rt, url := preciseRouter(t, []Backend{eventBackend(e)})
	wait.For(t, "block size known", func() bool { return rt.View(time.Now()).Replicas[0].BlockSize > 0 })
	msgs := []chatMsg{{"system", words(1, 50)}, {"user", words(2, 50)}}
	send := func() {
		b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "max_tokens": 2})
		if resp, out := do(t, "POST", url+"/v1/chat/completions", string(b)); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, out)
		}
	}
	send()
	send()
	if n := rt.st.hasher.Stats().RoundTrips; n != 1 {
		t.Errorf("%d /tokenize round trips for a repeated request, want 1", n)
	}
	msgs = append(msgs, chatMsg{"assistant", "ok"}, chatMsg{"user", words(3, 20)})
	send()
	if n := rt.st.hasher.Stats().RoundTrips; n != 2 {
		t.Errorf("%d /tokenize round trips after a new turn, want 2", n)
	}
	p, err := prefix.Parse(mustJSON(map[string]any{"model": "m", "messages": msgs}))
	if err != nil {
		t.Fatal(err)
	}
	var sc hashing.Scratch
	chains, n := rt.st.hasher.Hash(p, prefix.Root("m", ""), []int{16}, &sc)
	if want := chatKeys(msgs); len(chains) != 1 || !slices.Equal(chains[0].Hashes, want) || n < len(want)*16 {
		t.Errorf("router hashes %v (%d tokens), engine's %d blocks", chains, n, len(want))
	}
	if st := rt.st.hasher.Stats(); st.Fails != 0 {
		t.Errorf("%d tokenize failures", st.Fails)
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// TestPreciseBindMode: the router binds one SUB socket (--kv-events-bind)
// and an engine dials in, recognised by its topic's host:port (its
// backend's); it turns precise once its first events arrive, and the
// index then follows a workload routed through the router exactly.
func TestPreciseBindMode(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	rep := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
	rt, url := startRouter(t, "kv-aware", func(c *Config) {
		c.Backends = []Backend{{URL: "http://" + addr, Replay: rep}}
		c.KVEventsBind = "tcp://127.0.0.1:0"
		c.Tokenizer = Remote
		c.HealthInterval = 20 * time.Millisecond
	})
	runRouter(t, rt)
	if rt.st.fleet.IndexMode(0) != IndexApproximate {
		t.Errorf("mode before any event: %q, want approximate", rt.st.fleet.IndexMode(0))
	}
	e := eventEngine(t, 0, addr, rt.st.feed.sub.BindAddr(), rep)
	wait.For(t, "healthy", func() bool { return rt.st.healthy(0) })
	send := func(k int) {
		body := fmt.Sprintf(`{"model":"m","max_tokens":2,"prompt":"%s"}`, words(k, 40))
		if resp, out := do(t, "POST", url+"/v1/completions", body); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, out)
		}
	}
	// Until the engine's connection is up its events are dropped (PUB).
	k := 0
	wait.For(t, "an event through a dialing engine", func() bool {
		if rt.st.fleet.IndexMode(0) == IndexPrecise {
			return true
		}
		send(k)
		k++
		return false
	})
	e.Reset()
	wait.For(t, "the clear", func() bool { return rt.st.fleet.Tracker().Precise().Blocks(0) == 0 })
	var want []prefix.Hash
	for k := 1000; k < 1004; k++ {
		send(k)
		want = append(want, textKeys(words(k, 40))...)
	}
	// The subscriber's counters include the events before the reset:
	// wait for the index itself.
	wait.For(t, "the workload's blocks", func() bool {
		return slices.Equal(sortedSet(want), sortedSet(rt.st.fleet.Tracker().Precise().Hashes(0)))
	})
	if n := e.Stats().CachedBlocks; rt.st.fleet.Tracker().Precise().Blocks(0) != n {
		t.Errorf("index holds %d blocks, engine %d", rt.st.fleet.Tracker().Precise().Blocks(0), n)
	}
	if rec := rt.Decisions(1)[0]; rec.Index != IndexPrecise {
		t.Errorf("last decision index %q, want precise", rec.Index)
	}
}

// relay forwards a publisher's messages verbatim to its own PUB socket,
// dropping those whose number (from 1) drop says, to lose a batch on the
// way to the router.
type relay struct {
	addr    string
	mu      sync.Mutex
	n       int
	dropped int
	drop    func(n int) bool
}

func newRelay(t *testing.T, from string) *relay {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sub, pub := zmq4.NewSub(ctx), zmq4.NewPub(ctx)
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if err := sub.Dial(from); err != nil {
		t.Fatal(err)
	}
	sub.SetOption(zmq4.OptionSubscribe, "")
	r := &relay{addr: "tcp://" + pub.Addr().String(), drop: func(int) bool { return false }}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := sub.Recv()
			if err != nil {
				return
			}
			r.mu.Lock()
			r.n++
			skip := r.drop(r.n)
			if skip {
				r.dropped++
			}
			r.mu.Unlock()
			if !skip {
				pub.Send(m)
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		sub.Close()
		pub.Close()
		<-done
	})
	return r
}

// TestPreciseDroppedBatchReplayed: a batch lost between engine and router
// is seen as a gap and replayed from the engine's replay socket; the index
// ends equal to the engine's cache, with no reset.
func TestPreciseDroppedBatchReplayed(t *testing.T) {
	e := eventEngine(t, 0, "", "", "")
	rl := newRelay(t, e.KVEventsEndpoint())
	rt, url := preciseRouter(t, []Backend{{URL: e.URL(), KV: rl.addr, Replay: e.ReplayEndpoint()}})
	var want []prefix.Hash
	send := func(k int) []prefix.Hash {
		text := words(k, 40)
		body := fmt.Sprintf(`{"model":"m","max_tokens":2,"prompt":"%s"}`, text)
		if resp, out := do(t, "POST", url+"/v1/completions", body); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, out)
		}
		keys := textKeys(text)
		want = append(want, keys...)
		return keys
	}
	status := func() kvevents.Status { st, _ := rt.st.feed.sub.Status(0); return st }
	indexed := func(keys []prefix.Hash) bool {
		held := rt.st.fleet.Tracker().Precise().Hashes(0)
		return !slices.ContainsFunc(keys, func(h prefix.Hash) bool { return !slices.Contains(held, h) })
	}
	// Events through the relay: a request whose blocks reach the index
	// with no replay since it was sent came live, through the relay, so
	// both SUB sockets on the way are subscribed and the relay has had
	// every batch so far. A batch applied alone does not show it: the
	// router's join replays the engine's history straight from its replay
	// socket, and a batch a subscription not yet registered lost is
	// filled from there once the next batch shows the gap; so another
	// request goes when one's blocks came by a replay, or did not come
	// within 100 polls.
	var (
		keys         []prefix.Hash
		replays      uint64
		polls, sends int
	)
	wait.For(t, "a request's batch live through the relay", func() bool {
		switch {
		case keys != nil && indexed(keys):
			if status().Replays == replays {
				return true
			}
		case keys != nil && polls < 100:
			polls++
			return false
		}
		replays, polls = status().Replays, 0
		keys = send(sends)
		sends++
		return false
	})
	before := status()
	rl.mu.Lock()
	next := rl.n + 1
	rl.drop = func(n int) bool { return n == next }
	rl.mu.Unlock()
	send(1000) // its batch is dropped
	wait.For(t, "the drop", func() bool { rl.mu.Lock(); defer rl.mu.Unlock(); return rl.dropped == 1 })
	send(1001) // its batch reveals the gap
	wait.For(t, "the replayed index", func() bool {
		return slices.Equal(sortedSet(want), sortedSet(rt.st.fleet.Tracker().Precise().Hashes(0)))
	})
	k := rt.View(time.Now()).Replicas[0].Events
	if k.Gaps-before.Gaps != 1 || k.Replays <= before.Replays || k.Resets != 0 {
		t.Errorf("kv events view %+v, want 1 gap and a replay more than before the drop (%+v), no reset", k, before)
	}
	if got := gauge(t, rt, "kvrouter_kv_event_gaps_total", e.URL(), ""); got != float64(before.Gaps)+1 {
		t.Errorf("kvrouter_kv_event_gaps_total = %v, want 1 more than before the drop (%d)", got, before.Gaps)
	}
}

// TestPreciseBackendModel: an engine publishing under a topic that names
// no model (vLLM's default "", here "kv-events") is keyed under the
// backend's model= option, so the router's requests match its blocks.
func TestPreciseBackendModel(t *testing.T) {
	e, err := emulator.Start(emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: 0.01, Topic: "kv-events",
		KVEventsEndpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*"}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	b := eventBackend(e)
	b.Models = []string{"m"}
	rt, url := preciseRouter(t, []Backend{b})
	preciseReady(t, rt, 0)
	text := words(3, 60)
	body := fmt.Sprintf(`{"model":"m","max_tokens":2,"prompt":"%s"}`, text)
	if resp, out := do(t, "POST", url+"/v1/completions", body); resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, out)
	}
	settled(t, rt, 0, e)
	if d := cmp.Diff(sortedSet(textKeys(text)), sortedSet(rt.st.fleet.Tracker().Precise().Hashes(0))); d != "" {
		t.Errorf("index vs prompt sent (-want +got):\n%s", d)
	}
}

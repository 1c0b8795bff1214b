package proxy

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/sim"
	"github.com/kvrouter/kvrouter/trace"
	"github.com/kvrouter/kvrouter/view"
)

// parityEpoch is time zero of the parity test's live router: the fake
// clock's reading at a step is parityEpoch plus the step's virtual time.
var parityEpoch = time.Unix(1_000_000_000, 0)

// liveReplay is a live router driven step by step on a fake clock.
type liveReplay struct {
	rt    *Router
	now   time.Time
	calls map[string]*call
}

// newLiveReplay builds the live router for policy (a sim run name) over n
// replicas serving model, in token mode (the transcript's chains are
// engine blocks), with KV events followed when the simulator gives them
// to the policy. It is never Run: the test plays the scrapes, health
// changes and KV events itself, through the hooks their loops call.
func newLiveReplay(t *testing.T, policy string, n int, model string, events bool) *liveReplay {
	t.Helper()
	lr := &liveReplay{now: parityEpoch, calls: map[string]*call{}}
	cfg := DefaultConfig()
	name, precise := policy, false
	if base, ok := strings.CutSuffix(policy, sim.PreciseSuffix); ok {
		name, precise = base, true
	}
	cfg.Policy = name
	cfg.Tokenizer = Remote
	for i := range n {
		b := Backend{URL: fmt.Sprintf("http://r%d:8000", i), Models: []string{model}} // the simulator's names
		if events || precise {
			b.KV = fmt.Sprintf("tcp://127.0.0.1:%d", 1+i) // never reached: the test plays the events
		}
		cfg.Backends = append(cfg.Backends, b)
	}
	rt, err := New(cfg, Deps{Registry: prometheus.NewRegistry(), Logger: testLogger(t), Now: func() time.Time { return lr.now }})
	if err != nil {
		t.Fatal(err)
	}
	if rt.st.feed != nil {
		t.Cleanup(rt.st.feed.closeAll)
		// Every engine's stream is healthy, as in the simulator.
		rt.st.fleet.Tracker().SetFeed(nil)
	}
	lr.rt = rt
	return lr
}

// play applies one step of the simulator's transcript to the live router
// through the code the live router runs for it, and returns, for an
// arrival, what its policy saw and decided.
func (lr *liveReplay) play(t *testing.T, s sim.Step) (*call, bool) {
	t.Helper()
	rt := lr.rt
	lr.now = parityEpoch.Add(s.At)
	id := rt.name(max(s.Replica, 0))
	switch s.Kind {
	case sim.StepArrival:
		c := rt.newCall(httptest.NewRequest("POST", "/v1/completions", nil), true)
		c.id, c.freq, c.session = s.Request.ID, s.Request, s.Request.Session
		c.pick(nil)
		if c.ticket != nil {
			lr.calls[c.id] = c
		}
		return c, true
	case sim.StepFirstToken:
		c := lr.calls[s.ReqID]
		c.status = 200
		c.firstByte(lr.now)
	case sim.StepToken:
		lr.calls[s.ReqID].token(lr.now)
	case sim.StepDone:
		c := lr.calls[s.ReqID]
		delete(lr.calls, s.ReqID)
		c.usage, c.outcome, c.end = s.Usage, view.OutcomeOK, lr.now
		if s.Failed {
			c.outcome = view.OutcomeUpstreamError
		}
		c.settle()
	case sim.StepScrape:
		rt.st.scraper.OnLoad(id, s.Load)
	case sim.StepDown:
		rt.st.health.OnChange(id, false)
	case sim.StepAdd:
		b := Backend{URL: s.Backend, Models: []string{s.Model}}
		if rt.st.feed != nil {
			b.KV = "tcp://127.0.0.1:1" // never reached: the test plays the events
		}
		if err := rt.AddBackend(b, SourceAdmin); err != nil || rt.st.fleet.At(s.Backend) != s.Replica {
			t.Fatalf("adding %s: %v, at %d; the simulator's is at %d", s.Backend, err, rt.st.fleet.At(s.Backend), s.Replica)
		}
	case sim.StepRemove:
		if _, err := rt.RemoveBackend(id, SourceAdmin); err != nil {
			t.Fatal(err)
		}
	case sim.StepKV:
		x := rt.st.fleet.Tracker().Precise()
		switch s.Event {
		case engine.BlockStored:
			x.Store(s.Replica, s.Hashes, s.At)
		case engine.BlockRemoved:
			x.Remove(s.Replica, s.Hashes)
		case engine.AllCleared:
			x.Clear(s.Replica)
		}
	}
	return nil, false
}

// TestParity: the same requests with the same engine responses, fed
// through the simulator and through the live router's state on a fake
// clock, give identical snapshots, requests and decisions at every
// arrival, for every policy: the two sides run the same fleet code,
// membership changes (kill, add, remove) included.
func TestParity(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every policy on three workloads")
	}
	preset, err := engine.Preset(engine.DefaultPreset)
	if err != nil {
		t.Fatal(err)
	}
	policies := append(route.Names(), "kv-aware"+sim.PreciseSuffix)
	for _, wl := range []struct {
		name string
		opt  trace.GenOptions
	}{
		{"shared-prefix", trace.GenOptions{Seed: 3, Groups: 6, PerGroup: 8}},
		{"multi-turn-chat", trace.GenOptions{Seed: 3, Requests: 120}},
		{"hot-prefix", trace.GenOptions{Seed: 3, Requests: 120}},
		// A kill, an add and a removal: the fleet's membership changes
		// the same way on both sides.
		{"failure", trace.GenOptions{Seed: 3, Requests: 120}},
	} {
		w, err := trace.Generate(wl.name, wl.opt)
		if err != nil {
			t.Fatal(err)
		}
		for _, policy := range policies {
			t.Run(wl.name+"/"+policy, func(t *testing.T) {
				var steps []sim.Step
				cfg := sim.Config{Workload: wl.name, Requests: w.Requests, Fleet: w.Events, Replicas: 4, Load: 0.9, Preset: preset,
					Policies: []string{policy}, Seed: 3, KVEventDelay: 10 * time.Millisecond,
					Trace: func(_ string, s sim.Step) { steps = append(steps, s) }}
				if _, err := sim.Run(cfg); err != nil {
					t.Fatal(err)
				}
				events := false
				model := ""
				kinds := map[sim.StepKind]int{}
				for _, s := range steps {
					kinds[s.Kind]++
					events = events || s.Kind == sim.StepKV
					if s.Kind == sim.StepArrival {
						model = s.Request.Model
					}
				}
				if len(w.Events) > 0 && (kinds[sim.StepDown] != 1 || kinds[sim.StepAdd] != 1 || kinds[sim.StepRemove] != 1) {
					t.Fatalf("%d kills, %d adds, %d removals in the transcript; want one of each", kinds[sim.StepDown], kinds[sim.StepAdd], kinds[sim.StepRemove])
				}
				lr := newLiveReplay(t, policy, cfg.Replicas, model, events)
				// Metrics reach both at the policy's own scrape interval.
				var scrapes []time.Duration
				for _, s := range steps {
					if s.Kind == sim.StepScrape && s.Replica == 0 {
						scrapes = append(scrapes, s.At)
					}
				}
				if len(scrapes) < 2 || scrapes[1]-scrapes[0] != lr.rt.st.scraper.Interval {
					t.Errorf("scrapes at %v in the simulator, every %v live", scrapes[:min(len(scrapes), 2)], lr.rt.st.scraper.Interval)
				}
				// A request of the killed replica is decided again when it
				// continues on another (sim/continue.go): one arrival more.
				arrivals, requests := 0, map[string]bool{}
				for _, s := range steps {
					c, ok := lr.play(t, s)
					if !ok {
						continue
					}
					arrivals++
					requests[s.ReqID] = true
					if d := cmp.Diff(s.Snapshot, c.sc.Snapshot, cmpopts.EquateEmpty(), cmpopts.IgnoreFields(route.Snapshot{}, "Summary")); d != "" {
						t.Fatalf("arrival %d (%s) at %v: snapshots differ (-sim +live):\n%s", arrivals, s.ReqID, s.At, d)
					}
					live := c.sc.Request
					live.Costs = nil
					if d := cmp.Diff(s.Route, live, cmpopts.EquateEmpty()); d != "" {
						t.Fatalf("arrival %d (%s): requests differ (-sim +live):\n%s", arrivals, s.ReqID, d)
					}
					if d := cmp.Diff(s.Decision, c.dec, cmpopts.EquateEmpty()); d != "" {
						t.Fatalf("arrival %d (%s): decisions differ (-sim +live):\n%s", arrivals, s.ReqID, d)
					}
				}
				if len(requests) != len(w.Requests) {
					t.Errorf("%d requests' arrivals compared, want %d", len(requests), len(w.Requests))
				}
			})
		}
	}
}

package proxy

import (
	"fmt"
	"github.com/kvrouter/kvrouter/fleet"
	"math"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/route"
)

func TestScaleRates(t *testing.T) {
	base := route.Rates{PrefillPerToken: 40 * time.Microsecond, AttnPerMPairs: 1300 * time.Microsecond,
		DecodeStep: 15 * time.Millisecond, DecodePerSeq: 100 * time.Microsecond, DecodePerMTokens: 56 * time.Millisecond,
		MaxSeqs: 256, Horizon: time.Minute, Scale: 1.5, DecodeScale: 1.2}
	tests := []struct {
		name  string
		in    route.Rates
		scale float64
		want  route.Rates
	}{
		{"zero means real time", base, 0, base},
		{"real time", base, 1, base},
		{"ten times faster", base, 0.1, route.Rates{PrefillPerToken: 4 * time.Microsecond, AttnPerMPairs: 130 * time.Microsecond,
			DecodeStep: 1500 * time.Microsecond, DecodePerSeq: 10 * time.Microsecond, DecodePerMTokens: 5600 * time.Microsecond,
			MaxSeqs: 256, Horizon: time.Minute, Scale: 1.5, DecodeScale: 1.2}},
		{"slower", base, 2, route.Rates{PrefillPerToken: 80 * time.Microsecond, AttnPerMPairs: 2600 * time.Microsecond,
			DecodeStep: 30 * time.Millisecond, DecodePerSeq: 200 * time.Microsecond, DecodePerMTokens: 112 * time.Millisecond,
			MaxSeqs: 256, Horizon: time.Minute, Scale: 1.5, DecodeScale: 1.2}},
		{"never rounds to route's default", route.Rates{PrefillPerToken: 3, DecodeStep: 1}, 0.01,
			route.Rates{PrefillPerToken: 1, DecodeStep: 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, scaleRates(tc.in, tc.scale)); d != "" {
				t.Errorf("rates (-want +got):\n%s", d)
			}
		})
	}
}

// TestTimeScaleRates: the fleet's rates, which the cost model prices
// with, are the preset's times the configured time scale.
func TestTimeScaleRates(t *testing.T) {
	up := newFake(t, 0)
	for _, scale := range []float64{0, 1, 0.1} {
		rt, _ := startRouter(t, "kv-aware", func(c *Config) { c.TimeScale = scale }, up.URL)
		var s route.Snapshot
		rt.st.fleet.Snapshot(&s, time.Now(), 0)
		ecfg, err := engine.Preset(engine.DefaultPreset)
		if err != nil {
			t.Fatal(err)
		}
		want := ecfg.Rates().PrefillPerToken
		if scale > 0 {
			want = time.Duration(float64(want) * scale)
		}
		if got := s.Replicas[0].Rates.PrefillPerToken; got != want {
			t.Errorf("time scale %v: prefill per token %v, want %v", scale, got, want)
		}
	}
	cfg := DefaultConfig()
	cfg.Backends = []Backend{{URL: up.URL}}
	cfg.TimeScale = -1
	if _, err := New(cfg, Deps{}); err == nil || !strings.Contains(err.Error(), "time-scale") {
		t.Errorf("time scale -1: error %v, want one naming time-scale", err)
	}
}

// unservedRouter is a Router for policy in front of n backends that are
// never contacted: tests drive its decisions with decide.
func unservedRouter(t *testing.T, policy string, n int) *Router {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Policy = policy
	for i := range n {
		cfg.Backends = append(cfg.Backends, Backend{URL: fmt.Sprintf("http://10.0.%d.1:8000", i)})
	}
	rt, err := New(cfg, Deps{Registry: prometheus.NewRegistry(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// decide routes body on rt, without sending it, and returns the call.
func decide(t *testing.T, rt *Router, body string) *call {
	t.Helper()
	p, err := prefix.Parse([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	c := rt.newCall(httptest.NewRequest("POST", "/v1/chat/completions", nil), true)
	c.prompt = p
	if !c.route(nil) {
		t.Fatal("no replica chosen")
	}
	return c
}

// TestRecordLeavesOutPruned: on a fleet above 64 replicas the decision
// record lists the candidates kv-aware priced in full, the chosen one
// among them, and counts the pruned rest.
func TestRecordLeavesOutPruned(t *testing.T) {
	const n = 200
	rt := unservedRouter(t, "kv-aware", n)
	for k := range 3 * n { // load every replica differently
		c := decide(t, rt, fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"request %d"}]}`, k))
		if k%3 == 0 {
			c.ticket.Done(rt.now(), fleet.NoUsage, nil)
		}
	}
	rec := rt.Decisions(1)[0]
	chosen := false
	for _, c := range rec.Candidates {
		chosen = chosen || c.Replica == rec.Replica
	}
	if !chosen || rec.PrunedCandidates == 0 || len(rec.Candidates)+rec.PrunedCandidates != n {
		t.Errorf("record with %d candidates (chosen listed: %v) and %d pruned, want the chosen listed, some pruned, %d in all",
			len(rec.Candidates), chosen, rec.PrunedCandidates, n)
	}
}

// TestSnapshotIndexBlocks: the snapshot's IndexBlocks are the residency
// index's counts, replica by replica.
func TestSnapshotIndexBlocks(t *testing.T) {
	rt := unservedRouter(t, "sglang-cache-aware", 5)
	for k := range 20 {
		decide(t, rt, fmt.Sprintf(`{"model":"m","prompt":"%s %d"}`, strings.Repeat("long shared words ", 40*(k%4+1)), k))
	}
	var s route.Snapshot
	rt.st.fleet.Snapshot(&s, time.Now(), 0)
	some := false
	for i, r := range s.Replicas {
		want, _ := rt.st.fleet.Tracker().Blocks(i)
		some = some || want > 0
		if r.IndexBlocks != want {
			t.Errorf("replica %d: snapshot IndexBlocks %d, index %d", i, r.IndexBlocks, want)
		}
	}
	if !some {
		t.Error("no replica holds any block: the test routed nothing into the index")
	}
}

// TestRecordTotalAddsUp: every kv-aware candidate in a decision record
// adds up, TTFTWeight·(Wait + Import + Load + Prefill) + Decode + Others
// + Memory + Future + Misses, to its Total (the dashboard writes out that
// sum), with the record's weight kv-aware's 2.
func TestRecordTotalAddsUp(t *testing.T) {
	rt := unservedRouter(t, "kv-aware", 8)
	for k := range 40 {
		c := decide(t, rt, fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"shared prefix of some length %d"}]}`, k%5))
		if k%4 == 0 {
			c.ticket.Done(rt.now(), fleet.NoUsage, nil)
		}
	}
	for _, rec := range rt.Decisions(40) {
		if rec.TTFTWeight != 2 || len(rec.Candidates) == 0 {
			t.Fatalf("record %s: weight %v, %d candidates; want 2 and some", rec.ID, rec.TTFTWeight, len(rec.Candidates))
		}
		for _, c := range rec.Candidates {
			sum := rec.TTFTWeight*(c.WaitMS+c.ImportMS+c.LoadMS+c.PrefillMS) + c.DecodeMS + c.OthersMS + c.MemoryMS + c.FutureMS + c.MissesMS
			if math.Abs(sum-c.TotalMS) > 1e-3 || c.MissesMS < 0 || c.Miss < 0 || c.Miss > 1 {
				t.Errorf("record %s, %s: terms add up to %.6f ms, total %.6f ms (%+v)", rec.ID, c.Replica, sum, c.TotalMS, c)
			}
		}
	}
}

package sim

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/scrape"
	"github.com/kvrouter/kvrouter/trace"
)

// llamaChat is conversations that share nothing, as the real-engine
// suite's chat workload: sessions of turns, each its own 300-token system
// prompt, then per turn a 60-token question and a 30-token answer the
// next turn repeats, four requests a second, in arrival order.
func llamaChat(sessions, turns int) []trace.Request {
	var next uint64
	seg := func(n int) trace.Segment { next++; return trace.Segment{ID: 0x11a0000 + next, Tokens: n} }
	var reqs []trace.Request
	for s := range sessions {
		prompt := []trace.Segment{seg(300)}
		for k := range turns {
			prompt = append(prompt, seg(60))
			r := trace.Request{ID: fmt.Sprintf("c%d-%d", s, k), Session: fmt.Sprintf("c%d", s),
				At: time.Duration(k*sessions+s) * time.Second / 4, Segments: append([]trace.Segment(nil), prompt...), Output: 8}
			for _, sg := range prompt {
				r.Prompt += sg.Tokens
			}
			reqs = append(reqs, r)
			prompt = append(prompt, seg(30))
		}
	}
	slices.SortStableFunc(reqs, func(a, b trace.Request) int { return cmp.Compare(a.At, b.At) })
	return reqs
}

// TestLlamaCppPreset: on a llama.cpp preset the simulated engines keep
// their slots' prompts, the router's side reads them as llama.cpp
// replicas (engine, slots), as the live router reads llama-server, and
// models their slots: kv-aware's predicted cached tokens are the engines'
// within 2%, and session affinity reuses what round-robin's scattering
// loses.
func TestLlamaCppPreset(t *testing.T) {
	preset := engine.Config{Kind: engine.KindLlamaCpp, BlockSize: 4, NumBlocks: 2 * 4096 / 4, MaxNumSeqs: 2,
		PrefillPerToken: 100 * time.Microsecond, DecodeStep: 5 * time.Millisecond}
	scraped := map[string]bool{}
	run, err := Run(Config{Requests: llamaChat(7, 4), Replicas: 4, Preset: preset, Policies: []string{"round-robin", "session-hash", "kv-aware"},
		Trace: func(policy string, s Step) {
			if s.Kind == StepScrape {
				scraped[policy] = s.Load.Engine == scrape.EngineLlamaCpp && s.Load.Slots == 2
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	hit := map[string]float64{}
	for _, p := range run.Policies {
		hit[p.Policy] = p.HitRate
		if !scraped[p.Policy] {
			t.Errorf("%s: the fleet did not read its replicas as llama.cpp engines of 2 slots", p.Policy)
		}
		if p.Policy == "kv-aware" && math.Abs(p.PredictedHitRate-p.HitRate) > 0.02*p.HitRate {
			t.Errorf("kv-aware predicted hit %.3f, the engines' %.3f: more than 2%% apart", p.PredictedHitRate, p.HitRate)
		}
	}
	t.Logf("hit: round-robin %.3f, session-hash %.3f, kv-aware %.3f", hit["round-robin"], hit["session-hash"], hit["kv-aware"])
	if hit["session-hash"] <= hit["round-robin"] || hit["kv-aware"] <= hit["round-robin"] {
		t.Errorf("hit rates %v: want session-hash and kv-aware above round-robin", hit)
	}
}

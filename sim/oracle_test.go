package sim

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/trace"
)

// TestOraclesSkipRefused: a request longer than the max model length is
// refused by the engine, so the oracles neither count its prompt nor cache
// its blocks. Here it comes first and shares a 2,048-token prefix with the
// two requests after it: counted, it would give the second a hit the
// engine cannot have, and the policy would read below 100% of oracles it
// cannot reach.
func TestOraclesSkipRefused(t *testing.T) {
	const shared, question = 2048, 128
	req := func(i, unique int) trace.Request {
		return trace.Request{ID: "r" + string(rune('0'+i)), At: time.Duration(i) * 10 * time.Second, Output: 16,
			Segments: []trace.Segment{{ID: 1, Tokens: shared}, {ID: uint64(100 + i), Tokens: unique}}, Prompt: shared + unique}
	}
	reqs := []trace.Request{req(0, 3000), req(1, question), req(2, question)} // 5,048 + 16 > 4,096
	cfg := Config{Requests: reqs, Replicas: 1, Preset: engine.Config{MaxModelLen: 4096}, Policies: []string{"round-robin"}}
	o, err := simulate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := oracleResult{Prompt: 2 * (shared + question), Cached: shared} // r1 misses, r2 hits the prefix
	for name, got := range map[string]oracleResult{"infinite": o.infinite, "pooled": o.pooled} {
		if got != want {
			t.Errorf("%s oracle: got %+v, want %+v", name, got, want)
		}
	}
	if ok, rej, errs := o.runs[0].counts(); ok != 2 || rej != 0 || errs != 1 {
		t.Errorf("got %d served, %d rejected, %d errors; want 2, 0, 1 (the long request refused)", ok, rej, errs)
	}
	if got := hitRate(o.runs[0]); got != want.rate() {
		t.Errorf("policy hit rate %.6f, want the oracles' %.6f (one replica, no eviction)", got, want.rate())
	}
	// The predicate is the engine's own.
	pc := o.cfg.Preset
	for _, j := range o.jobs {
		e, err := engine.New(pc)
		if err != nil {
			t.Fatal(err)
		}
		added := e.Add(0, &engine.Request{ID: j.id, Prompt: j.prompt, Hashes: j.hashes, MaxTokens: j.output}) == nil
		if s := servable(&pc, &j); s != added {
			t.Errorf("%s: servable %v, but the engine's Add accepted it: %v", j.id, s, added)
		}
	}
}

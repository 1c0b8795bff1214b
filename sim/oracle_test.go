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

// TestPooledOracleCountsTheCPUTier: a working set of 8 prompts of 64
// blocks each, asked for in turn three times, cycles through a GPU cache
// of 100 blocks (LRU's worst case: every block is evicted before it is
// asked for again) but fits in a CPU tier of 1,000 beside it. Without the
// tier the pooled oracle serves nothing from cache; with it every prompt
// after the first round is served without computing, as the engines
// count a block loaded from the tier.
func TestPooledOracleCountsTheCPUTier(t *testing.T) {
	const bs, blocks = 16, 64
	var reqs []trace.Request
	for range 3 {
		for p := range 8 {
			n := len(reqs)
			reqs = append(reqs, trace.Request{ID: "r" + string(rune('a'+n)), At: time.Duration(n) * time.Second, Output: 1,
				Segments: []trace.Segment{{ID: uint64(p + 1), Tokens: blocks * bs}}, Prompt: blocks * bs})
		}
	}
	c := engine.Config{BlockSize: bs, NumBlocks: 100}
	e, err := engine.New(c)
	if err != nil {
		t.Fatal(err)
	}
	c = e.Config()
	jobs := makeJobs(reqs, bs, 1, 1)
	if got := pooledOracle(jobs, &c, 100, 0); got.Cached != 0 {
		t.Errorf("without a tier: %d cached tokens, want 0 (the set cycles through the GPU cache)", got.Cached)
	}
	want := int64(2 * 8 * cachedTokens(blocks, blocks*bs, bs)) // the engine computes a whole prompt's last block
	if got := pooledOracle(jobs, &c, 100, 1000); got.Cached != want {
		t.Errorf("with a tier of 1,000 blocks: %d cached tokens, want %d", got.Cached, want)
	}
}

// TestPreciseSuffixIsRefusedWhereItChangesNothing: "-precise" runs a
// policy on the index the engines' KV events feed; a policy that models
// its own router's approximate index (sized or expiring), or reads no
// index, would silently run unchanged, so the name is refused.
func TestPreciseSuffixIsRefusedWhereItChangesNothing(t *testing.T) {
	for name, ok := range map[string]bool{
		"kv-aware-precise": true, "preble-e2-precise": true,
		"llm-d-precise": false, "sglang-cache-aware-precise": false, "aibrix-prefix-precise": false, "round-robin-precise": false,
	} {
		_, precise, err := policyOf(name)
		if ok && (err != nil || !precise) {
			t.Errorf("%s: precise %v, error %v; want it run on the precise index", name, precise, err)
		}
		if !ok && err == nil {
			t.Errorf("%s: accepted, want an error", name)
		}
	}
}

package engine

import (
	"testing"
	"time"
)

// TestLlamaCppSlots: a llama.cpp engine of two slots. A conversation's
// second turn reuses its first prompt from the slot it left (all of it
// but the partial last block), a prompt that shares nothing takes the
// other slot, a third conversation evicts the least recently used slot's
// prompt to the host cache, from which that conversation's next turn
// loads it back; no KV event is reported, and every prompt token is
// counted once as looked up.
func TestLlamaCppSlots(t *testing.T) {
	e := mustNew(t, Config{Kind: KindLlamaCpp, MaxNumSeqs: 2, BlockSize: 4, NumBlocks: 2 * 1024})
	a1, b1, c1 := toks(0, 100), toks(10_000, 100), toks(20_000, 100)
	a2 := append(append(toks(0, 100), toks(30_000, 10)...), toks(40_000, 20)...)
	b2 := append(append(toks(10_000, 100), toks(50_000, 10)...), toks(60_000, 20)...)
	evs := drive(t, e, []arrival{
		{0, Request{ID: "a1", Tokens: a1, MaxTokens: 4}},
		{time.Second, Request{ID: "b1", Tokens: b1, MaxTokens: 4}},
		{2 * time.Second, Request{ID: "a2", Tokens: a2, MaxTokens: 4}},
		{3 * time.Second, Request{ID: "c1", Tokens: c1, MaxTokens: 4}}, // LRU: b1's slot
		{4 * time.Second, Request{ID: "b2", Tokens: b2, MaxTokens: 4}}, // from the host cache
	})
	for _, ev := range evs {
		if ev.Kind == BlockStored || ev.Kind == BlockRemoved {
			t.Fatalf("a llama.cpp engine reported a KV event: %+v", ev)
		}
	}
	want := map[string]int{"a1": 0, "b1": 0, "a2": 100, "c1": 0, "b2": 100}
	done := doneOf(evs)
	for id, cached := range want {
		if got := done[id].CachedTokens; got != cached {
			t.Errorf("%s: %d cached tokens, want %d", id, got, cached)
		}
	}
	st := e.Stats()
	if st.PrefixQueries != 100*3+130*2 || st.PrefixHits != 200 {
		t.Errorf("looked up %d tokens and hit %d, want %d and 200", st.PrefixQueries, st.PrefixHits, 100*3+130*2)
	}
}

// TestLlamaCppDeferred: with both slots busy, a third request waits for
// the first slot freed, and a slot's context bounds a request's length.
func TestLlamaCppDeferred(t *testing.T) {
	c := Config{Kind: KindLlamaCpp, MaxNumSeqs: 2, BlockSize: 4, NumBlocks: 2 * 64}
	if err := c.CheckLength(250, 10); err == nil {
		t.Error("260 tokens accepted on slots of 256 tokens")
	}
	e := mustNew(t, c)
	evs := drive(t, e, []arrival{
		{0, Request{ID: "x", Tokens: toks(0, 40), MaxTokens: 50}},
		{0, Request{ID: "y", Tokens: toks(1000, 40), MaxTokens: 50}},
		{0, Request{ID: "z", Tokens: toks(2000, 40), MaxTokens: 5}},
	})
	done := doneOf(evs)
	if done["z"].Started < done["x"].At && done["z"].Started < done["y"].At {
		t.Errorf("z started at %v, before either slot was freed (%v, %v)", done["z"].Started, done["x"].At, done["y"].At)
	}
}

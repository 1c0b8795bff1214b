package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kvrouter/kvrouter/prefix"
)

func TestRepeatPrompt(t *testing.T) {
	for _, tc := range []struct {
		name       string
		prompt     int
		wantCached int
	}{
		{"partial last block", 1000, 992},
		// A whole-prompt hit still recomputes the last token, so the last
		// block is not counted.
		{"exact blocks", 1024, 1008},
		{"shorter than a block", 15, 0},
		{"long", 20000, 19984},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := mustNew(t, Config{})
			evs := drive(t, e, []arrival{
				{0, Request{ID: "a", Tokens: toks(0, tc.prompt), MaxTokens: 4}},
				{10 * time.Second, Request{ID: "b", Tokens: toks(0, tc.prompt), MaxTokens: 4}},
			})
			d := doneOf(evs)
			a, b := d["a"], d["b"]
			if a.CachedTokens != 0 {
				t.Errorf("first cached %d, want 0", a.CachedTokens)
			}
			if b.CachedTokens != tc.wantCached {
				t.Errorf("second cached %d, want %d", b.CachedTokens, tc.wantCached)
			}
			ttftA, ttftB := a.First-a.Arrived, b.First-b.Arrived
			if tc.wantCached > 0 && ttftB >= ttftA {
				t.Errorf("second TTFT %v, want < first %v", ttftB, ttftA)
			}
			st := e.Stats()
			if st.PrefixQueries != int64(2*tc.prompt) || st.PrefixHits != int64(tc.wantCached) {
				t.Errorf("queries %d hits %d, want %d %d", st.PrefixQueries, st.PrefixHits, 2*tc.prompt, tc.wantCached)
			}
			if st.UsedBlocks != 0 {
				t.Errorf("used blocks %d after all done, want 0", st.UsedBlocks)
			}
		})
	}
}

func TestConversation(t *testing.T) {
	turn1 := toks(100, 1500)
	// Turn 2 is turn 1, the reply and a new user message.
	turn2 := append(append(toks(100, 1500), toks(9000, 60)...), toks(5000, 300)...)
	for _, tc := range []struct {
		name       string
		lora2      string
		wantCached int
	}{
		{"same adapter", "", 1488},
		{"other adapter", "sql", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := mustNew(t, Config{})
			d := doneOf(drive(t, e, []arrival{
				{0, Request{ID: "t1", Tokens: turn1, MaxTokens: 60}},
				{5 * time.Second, Request{ID: "t2", Tokens: turn2, MaxTokens: 60, LoRA: tc.lora2}},
			}))
			if got := d["t2"].CachedTokens; got != tc.wantCached {
				t.Errorf("turn 2 cached %d, want %d", got, tc.wantCached)
			}
		})
	}
}

func TestBurstDoesNotReuseUnfinished(t *testing.T) {
	for _, tc := range []struct {
		name       string
		prompt, n  int
		gap        time.Duration
		wantCached []int
	}{
		// All fit one step's budget: scheduled together, nothing computed
		// yet, nothing reused.
		{"one step", 1000, 4, 0, []int{0, 0, 0, 0}},
		// The first prompt takes two steps (8192 + 3808 tokens); the second
		// joins in step 2 and reuses only the 512 blocks step 1 computed.
		{"chunked", 12000, 2, 0, []int{0, 8192}},
		// Arriving after the first is done, everything but the last token
		// is reused.
		{"sequential", 1000, 2, 5 * time.Second, []int{0, 992}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := mustNew(t, Config{})
			var as []arrival
			for i := range tc.n {
				as = append(as, arrival{time.Duration(i) * tc.gap,
					Request{ID: fmt.Sprint(i), Tokens: toks(0, tc.prompt), MaxTokens: 8}})
			}
			d := doneOf(drive(t, e, as))
			var got []int
			for i := range tc.n {
				got = append(got, d[fmt.Sprint(i)].CachedTokens)
			}
			if diff := cmp.Diff(tc.wantCached, got); diff != "" {
				t.Errorf("cached tokens (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEviction(t *testing.T) {
	for _, tc := range []struct {
		name        string
		blocks      int
		wantRemoved bool
		wantCached  int
	}{
		{"roomy cache", 10000, false, 992},
		{"small cache", 200, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := mustNew(t, Config{NumBlocks: tc.blocks})
			// Ten distinct 1000-token prompts (630 blocks), then the first
			// one again.
			var as []arrival
			for i := range 10 {
				as = append(as, arrival{time.Duration(i) * time.Second,
					Request{ID: fmt.Sprint(i), Tokens: toks(10000*i, 1000), MaxTokens: 8}})
			}
			as = append(as, arrival{20 * time.Second, Request{ID: "again", Tokens: toks(0, 1000), MaxTokens: 8}})
			evs := drive(t, e, as)
			removed := 0
			for _, ev := range evs {
				if ev.Kind == BlockRemoved {
					removed += len(ev.Hashes)
				}
			}
			if (removed > 0) != tc.wantRemoved {
				t.Errorf("removed %d blocks, want removals %v", removed, tc.wantRemoved)
			}
			if got := doneOf(evs)["again"].CachedTokens; got != tc.wantCached {
				t.Errorf("repeat cached %d, want %d", got, tc.wantCached)
			}
			st := e.Stats()
			if int64(removed) != st.RemovedBlocks || st.CachedBlocks > tc.blocks {
				t.Errorf("stats removed %d cached %d, want %d and <= %d", st.RemovedBlocks, st.CachedBlocks, removed, tc.blocks)
			}
		})
	}
}

// TestBlockEvents checks that the stored and removed events replay to
// exactly the engine's cache, with vLLM's chain fields.
func TestBlockEvents(t *testing.T) {
	root := prefix.Hash(42)
	e := mustNew(t, Config{NumBlocks: 150, Root: root})
	given := []prefix.Hash{7, 8, 9}
	evs := drive(t, e, []arrival{
		{0, Request{ID: "a", Tokens: toks(0, 1000), MaxTokens: 20}},
		{0, Request{ID: "l", Tokens: toks(0, 100), MaxTokens: 5, LoRA: "x"}},
		{time.Second, Request{ID: "h", Prompt: 60, Hashes: given, MaxTokens: 5}},
		{2 * time.Second, Request{ID: "b", Tokens: toks(5000, 1600), MaxTokens: 20}},
	})
	want := prefix.Blocks(root, toks(0, 1000), 16, nil)
	replay := map[prefix.Hash]bool{}
	var firstA []prefix.Hash
	for _, ev := range evs {
		switch ev.Kind {
		case BlockStored:
			if len(ev.TokenIDs) != 0 && len(ev.TokenIDs) != 16*len(ev.Hashes) {
				t.Errorf("stored %d hashes with %d token ids", len(ev.Hashes), len(ev.TokenIDs))
			}
			if ev.BlockSize != 16 {
				t.Errorf("block size %d, want 16", ev.BlockSize)
			}
			if ev.HasParent && !replay[ev.Parent] {
				t.Errorf("parent %x not stored before", ev.Parent)
			}
			if firstA == nil {
				firstA = ev.Hashes
			}
			for _, h := range ev.Hashes {
				if replay[h] {
					t.Errorf("hash %x stored twice", h)
				}
				replay[h] = true
			}
		case BlockRemoved:
			for _, h := range ev.Hashes {
				if !replay[h] {
					t.Errorf("hash %x removed but not stored", h)
				}
				delete(replay, h)
			}
		}
	}
	if diff := cmp.Diff(want, firstA); diff != "" {
		t.Errorf("first stored chain (-want +got):\n%s", diff)
	}
	var got []prefix.Hash
	for h := range replay {
		got = append(got, h)
	}
	if diff := cmp.Diff(e.Cached(), got, cmpSorted); diff != "" {
		t.Errorf("replayed events vs Cached (-cached +replay):\n%s", diff)
	}
	lora := prefix.Blocks(prefix.Chain(root, []byte("x")), toks(0, 100), 16, nil)
	if lora[0] == want[0] {
		t.Errorf("LoRA block hash equals the base model's")
	}
}

var cmpSorted = cmp.Transformer("sort", func(in []prefix.Hash) []prefix.Hash {
	out := append([]prefix.Hash(nil), in...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
})

func TestReset(t *testing.T) {
	e := mustNew(t, Config{})
	if err := e.Add(0, &Request{ID: "a", Tokens: toks(0, 500), MaxTokens: 3}); err != nil {
		t.Fatal(err)
	}
	_, next := e.Step(0)
	if e.Reset(0) {
		t.Errorf("Reset with a request running = true, want false")
	}
	for next != Idle {
		_, next = e.Step(next)
	}
	if len(e.Cached()) == 0 {
		t.Fatalf("no cached blocks before reset")
	}
	if !e.Reset(time.Minute) {
		t.Fatalf("Reset when idle = false, want true")
	}
	evs, _ := e.Step(time.Minute)
	if len(evs) != 1 || evs[0].Kind != AllCleared {
		t.Errorf("events after reset %+v, want one AllCleared", evs)
	}
	if n := len(e.Cached()); n != 0 {
		t.Errorf("%d cached blocks after reset, want 0", n)
	}
	d := doneOf(drive(t, e, []arrival{{2 * time.Minute, Request{ID: "b", Tokens: toks(0, 500), MaxTokens: 3}}}))
	if d["b"].CachedTokens != 0 {
		t.Errorf("cached %d after reset, want 0", d["b"].CachedTokens)
	}
}

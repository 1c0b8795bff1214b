package engine

import (
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
)

// evictAndReturn runs prompt a, then an unrelated prompt b that evicts
// part of a from a 100-block GPU cache, then a again, and returns the
// events.
func evictAndReturn(t *testing.T, cfg Config) []Event {
	t.Helper()
	cfg.NumBlocks = 100
	e := mustNew(t, cfg)
	return drive(t, e, []arrival{
		{0, Request{ID: "a", Tokens: toks(0, 1000), MaxTokens: 4}},
		{5 * time.Second, Request{ID: "b", Tokens: toks(50_000, 1000), MaxTokens: 4}},
		{10 * time.Second, Request{ID: "c", Tokens: toks(0, 1000), MaxTokens: 4}},
	})
}

func TestCPUTierLoadsWhatTheGPUEvicted(t *testing.T) {
	without := doneOf(evictAndReturn(t, Config{}))["c"]
	evs := evictAndReturn(t, Config{CPUBlocks: 1000})
	with := doneOf(evs)["c"]

	// Without a tier, c hits only what b left of a on the GPU; with one,
	// the rest loads from CPU and c is cached as if nothing was evicted.
	if without.CachedTokens >= 992 || without.CachedTokens == 0 {
		t.Fatalf("without a tier c cached %d tokens: the scenario should evict part of a", without.CachedTokens)
	}
	if with.CachedTokens != 992 {
		t.Errorf("with a tier c cached %d tokens, want 992 (all but the last block)", with.CachedTokens)
	}
	if got, want := with.CPUCachedTokens, 992-without.CachedTokens; got != want {
		t.Errorf("c loaded %d tokens from CPU, want %d (what the GPU lost)", got, want)
	}
	if without.CPUCachedTokens != 0 {
		t.Errorf("without a tier c loaded %d tokens from CPU", without.CPUCachedTokens)
	}

	// Loading is faster than recomputing, and takes the link's time.
	cfg := Config{}.defaults()
	load := time.Duration(with.CPUCachedTokens/cfg.BlockSize) * cfg.blockLoad()
	ttftWith, ttftWithout := with.First-with.Arrived, without.First-without.Arrived
	if ttftWith >= ttftWithout {
		t.Errorf("TTFT with a CPU tier %v, want < %v without", ttftWith, ttftWithout)
	}
	if ttftWith < load {
		t.Errorf("TTFT with a CPU tier %v, shorter than the load's %v", ttftWith, load)
	}

	// Every computed block was written through to CPU; the loaded ones
	// are stored on the GPU again.
	var cpuStored, gpuStoredAtC int
	for _, ev := range evs {
		switch {
		case ev.Kind == BlockStored && ev.Medium == CPU:
			cpuStored += len(ev.Hashes)
		case ev.Kind == BlockStored && ev.Medium == GPU && ev.At >= 10*time.Second:
			gpuStoredAtC += len(ev.Hashes)
		case ev.Kind == BlockRemoved && ev.Medium == CPU:
			t.Errorf("CPU tier of 1000 blocks dropped %d blocks", len(ev.Hashes))
		}
	}
	if cpuStored != 2*62 {
		t.Errorf("%d blocks stored on CPU, want %d (a's and b's full blocks)", cpuStored, 2*62)
	}
	if want := with.CPUCachedTokens / cfg.BlockSize; gpuStoredAtC != want {
		t.Errorf("%d blocks stored on GPU when c ran, want the %d it loaded", gpuStoredAtC, want)
	}
}

func TestCPUTierIsLRU(t *testing.T) {
	e := mustNew(t, Config{CPUBlocks: 10})
	evs := drive(t, e, []arrival{{0, Request{ID: "a", Tokens: toks(0, 20*16+1), MaxTokens: 2}}})
	var stored, removed []uint64
	for _, ev := range evs {
		for _, h := range ev.Hashes {
			switch {
			case ev.Kind == BlockStored && ev.Medium == CPU:
				stored = append(stored, uint64(h))
			case ev.Kind == BlockRemoved && ev.Medium == CPU:
				removed = append(removed, uint64(h))
			}
		}
	}
	if len(stored) != 20 || len(removed) != 10 {
		t.Fatalf("CPU stored %d removed %d blocks, want 20 and 10", len(stored), len(removed))
	}
	for i := range removed {
		if removed[i] != stored[i] {
			t.Fatalf("CPU dropped block %d of the chain first, want the oldest ones in order", i)
		}
	}
	if st := e.Stats(); st.CPUCachedBlocks != 10 || st.CPUBlocks != 10 {
		t.Errorf("CPU tier holds %d of %d blocks, want 10 of 10", st.CPUCachedBlocks, st.CPUBlocks)
	}
}

func TestCPULoadsShareTheLink(t *testing.T) {
	// Two prompts computed, evicted from a small GPU cache by a third,
	// then both requested at once: the second load waits for the first.
	e := mustNew(t, Config{NumBlocks: 200, CPUBlocks: 1000})
	drive(t, e, []arrival{
		{0, Request{ID: "a", Tokens: toks(0, 1601), MaxTokens: 2}},
		{time.Second, Request{ID: "b", Tokens: toks(10_000, 1601), MaxTokens: 2}},
		{2 * time.Second, Request{ID: "x", Tokens: toks(20_000, 3000), MaxTokens: 2}},
	})
	now := 10 * time.Second
	for _, id := range []string{"a2", "b2"} {
		from := map[string]int{"a2": 0, "b2": 10_000}[id]
		if err := e.Add(now, &Request{ID: id, Tokens: toks(from, 1601), MaxTokens: 2}); err != nil {
			t.Fatal(err)
		}
	}
	e.Step(now)
	a2, b2 := e.byID["a2"], e.byID["b2"]
	if a2.loading == 0 || b2.loading == 0 {
		t.Fatalf("loading %d and %d blocks, want both loading from CPU", a2.loading, b2.loading)
	}
	per := e.cfg.blockLoad()
	if want := now + time.Duration(a2.loading)*per; a2.loadedAt != want {
		t.Errorf("first load done at %v, want %v", a2.loadedAt, want)
	}
	if want := a2.loadedAt + time.Duration(b2.loading)*per; b2.loadedAt != want {
		t.Errorf("second load done at %v, want %v (after the first, on the same link)", b2.loadedAt, want)
	}
}

func TestImportFromPeer(t *testing.T) {
	prompt := toks(0, 4000)
	src := mustNew(t, Config{})
	drive(t, src, []arrival{{0, Request{ID: "warm", Tokens: prompt, MaxTokens: 2}}})
	hashes := prefix.Blocks(src.cfg.Root, prompt, 16, nil)
	held := src.Holds(hashes)
	if held != len(hashes) {
		t.Fatalf("source holds %d of %d blocks", held, len(hashes))
	}

	ttft := func(r Request) Event {
		dst := mustNew(t, Config{})
		return doneOf(drive(t, dst, []arrival{{10 * time.Second, r}}))[r.ID]
	}
	recompute := ttft(Request{ID: "r", Tokens: prompt, MaxTokens: 2})
	now := 10 * time.Second
	sent := src.Send(now, held)
	imported := ttft(Request{ID: "i", Tokens: prompt, MaxTokens: 2, RemoteBlocks: held, RemoteSent: sent})

	// The prompt's blocks but the last (recomputed for its logits) arrive.
	if want := (4000 - 1) / 16 * 16; imported.CachedTokens != want || imported.RemoteCachedTokens != want {
		t.Errorf("imported request cached %d tokens, %d from the peer; want %d and %d", imported.CachedTokens, imported.RemoteCachedTokens, want, want)
	}
	cfg := src.Config()
	transfer := time.Duration(imported.RemoteCachedTokens/16) * cfg.BlockTransfer()
	got := imported.First - imported.Arrived
	if got < transfer || got >= recompute.First-recompute.Arrived {
		t.Errorf("TTFT with the import %v, want at least the transfer %v and below recomputing's %v",
			got, transfer, recompute.First-recompute.Arrived)
	}
	if sent-now != time.Duration(held)*cfg.BlockTransfer() {
		t.Errorf("source sent %d blocks in %v, want %v", held, sent-now, time.Duration(held)*cfg.BlockTransfer())
	}
}

func TestImportOfEvictedBlocksRecomputes(t *testing.T) {
	// A source that evicted the prompt's tail since sends only the head it
	// still holds; the request computes the rest.
	src := mustNew(t, Config{NumBlocks: 300})
	prompt := toks(0, 4000)
	drive(t, src, []arrival{
		{0, Request{ID: "warm", Tokens: prompt, MaxTokens: 2}},
		{time.Second, Request{ID: "other", Tokens: toks(90_000, 1600), MaxTokens: 2}},
	})
	hashes := prefix.Blocks(src.cfg.Root, prompt, 16, nil)
	held := src.Holds(hashes)
	if held == 0 || held >= len(hashes) {
		t.Fatalf("source holds %d of %d blocks, want a part", held, len(hashes))
	}
	dst := mustNew(t, Config{})
	d := doneOf(drive(t, dst, []arrival{{10 * time.Second, Request{ID: "r", Tokens: prompt, MaxTokens: 2,
		RemoteBlocks: held, RemoteSent: src.Send(10*time.Second, held)}}}))["r"]
	if d.CachedTokens != held*16 || d.RemoteCachedTokens != held*16 {
		t.Errorf("cached %d, remote %d, want %d both", d.CachedTokens, d.RemoteCachedTokens, held*16)
	}
	if st := dst.Stats(); st.PrefillTokens != int64(4000-held*16) {
		t.Errorf("computed %d prompt tokens, want the %d not received", st.PrefillTokens, 4000-held*16)
	}
}

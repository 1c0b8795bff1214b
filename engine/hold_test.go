package engine

import (
	"slices"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
)

// runUntilDone adds r at now and steps e until r is done, returning its
// Done event and the engine time then.
func runUntilDone(t *testing.T, e *Engine, now time.Duration, r Request) (Event, time.Duration) {
	t.Helper()
	if err := e.Add(now, &r); err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		out, next := e.Step(now)
		for _, ev := range out {
			if ev.Kind == Done && ev.Req == r.ID {
				return ev, now
			}
		}
		now = next
	}
	t.Fatalf("%s never finished", r.ID)
	return Event{}, 0
}

// TestHoldKeepsBlocksUntilRead: a request with HoldFor finishes holding
// its blocks (in use, not evictable), names its full prompt blocks, and a
// read of them sends them and frees the hold once they are sent; the
// blocks stay cached.
func TestHoldKeepsBlocksUntilRead(t *testing.T) {
	e := mustNew(t, Config{NumBlocks: 100})
	prompt := toks(0, 5*16+3)
	done, now := runUntilDone(t, e, 0, Request{ID: "p", Tokens: prompt, MaxTokens: 1, HoldFor: 10 * time.Second})
	if len(done.HeldBlocks) != 5 {
		t.Fatalf("held %d blocks named, want 5 (the full prompt blocks)", len(done.HeldBlocks))
	}
	st := e.Stats()
	if st.HeldBlocks != 6 || st.UsedBlocks != 6 {
		t.Errorf("held %d, used %d blocks, want 6 and 6 (the partial block too)", st.HeldBlocks, st.UsedBlocks)
	}
	if e.pool.nfree != 100-6 {
		t.Errorf("%d blocks evictable or free, want %d: held blocks must not be evictable", e.pool.nfree, 100-6)
	}
	if _, next := e.Step(now); next != now+10*time.Second {
		t.Errorf("idle engine wakes at %v, want the hold's expiry %v", next, now+10*time.Second)
	}

	hashes, sent, ok := e.Read(now, "p", done.HeldBlocks)
	want := prefix.Blocks(e.cfg.Root, prompt, 16, nil)
	if !ok || !slices.Equal(hashes, want) {
		t.Fatalf("read: ok %v, hashes %v, want %v", ok, hashes, want)
	}
	if got := sent - now; got != 5*e.cfg.BlockTransfer() {
		t.Errorf("sent in %v, want %v", got, 5*e.cfg.BlockTransfer())
	}
	if _, _, ok := e.Read(now, "p", done.HeldBlocks); ok {
		t.Error("a second read found the blocks")
	}
	e.Step(sent - 1)
	if got := e.Stats().HeldBlocks; got != 6 {
		t.Errorf("%d blocks held while being sent, want 6", got)
	}
	e.Step(sent)
	st = e.Stats()
	if st.HeldBlocks != 0 || st.UsedBlocks != 0 || st.ExpiredHolds != 0 || st.SentBlocks != 5 {
		t.Errorf("after the read: held %d, used %d, expired %d, sent %d; want 0, 0, 0, 5",
			st.HeldBlocks, st.UsedBlocks, st.ExpiredHolds, st.SentBlocks)
	}
	if got := e.Holds(want); got != 5 {
		t.Errorf("%d of the blocks still cached, want 5", got)
	}
}

// TestHoldExpires: a hold nobody reads is freed at its expiry and counted;
// a read after it finds nothing.
func TestHoldExpires(t *testing.T) {
	e := mustNew(t, Config{NumBlocks: 100})
	done, now := runUntilDone(t, e, 0, Request{ID: "p", Tokens: toks(0, 40), MaxTokens: 1, HoldFor: time.Second})
	_, next := e.Step(now)
	e.Step(next - 1)
	if got := e.Stats().HeldBlocks; got != 3 {
		t.Fatalf("%d blocks held before the expiry, want 3", got)
	}
	e.Step(next)
	if st := e.Stats(); st.HeldBlocks != 0 || st.UsedBlocks != 0 || st.ExpiredHolds != 1 {
		t.Errorf("after the expiry: held %d, used %d, expired %d; want 0, 0, 1", st.HeldBlocks, st.UsedBlocks, st.ExpiredHolds)
	}
	if _, _, ok := e.Read(next, "p", done.HeldBlocks); ok {
		t.Error("a read after the expiry found the blocks")
	}

	// A read due after the expiry finds nothing even if no Step ran.
	done, now = runUntilDone(t, e, next, Request{ID: "q", Tokens: toks(0, 40), MaxTokens: 1, HoldFor: time.Second})
	if _, _, ok := e.Read(now+time.Second, "q", done.HeldBlocks); ok {
		t.Error("a read at the expiry found the blocks")
	}
	if st := e.Stats(); st.HeldBlocks != 0 || st.ExpiredHolds != 2 {
		t.Errorf("after the second expiry: held %d, expired %d; want 0, 2", st.HeldBlocks, st.ExpiredHolds)
	}
}

// TestHoldReadsOnlyItsBlocks: a read gets the leading ids that are the
// request's own; one whose first id is not leaves the hold in place.
func TestHoldReadsOnlyItsBlocks(t *testing.T) {
	e := mustNew(t, Config{NumBlocks: 100})
	done, now := runUntilDone(t, e, 0, Request{ID: "p", Tokens: toks(0, 64), MaxTokens: 1, HoldFor: time.Second})
	ids := done.HeldBlocks
	if hashes, _, ok := e.Read(now, "p", []int32{ids[1], ids[0]}); !ok || hashes != nil {
		t.Errorf("read of foreign ids: ok %v, %d hashes; want ok and none", ok, len(hashes))
	}
	if hashes, _, ok := e.Read(now, "p", []int32{ids[0], ids[1], 99_999}); !ok || len(hashes) != 2 {
		t.Errorf("read of two ids and a foreign one: ok %v, %d hashes; want 2", ok, len(hashes))
	}
}

// TestHoldNotTaken: a prompt shorter than a block, a request without
// HoldFor and a canceled one free their blocks at once.
func TestHoldNotTaken(t *testing.T) {
	e := mustNew(t, Config{NumBlocks: 100})
	for i, r := range []Request{
		{ID: "short", Tokens: toks(0, 10), MaxTokens: 1, HoldFor: time.Second},
		{ID: "plain", Tokens: toks(100, 40), MaxTokens: 1},
	} {
		done, _ := runUntilDone(t, e, time.Duration(i)*time.Minute, r)
		if done.HeldBlocks != nil || e.Stats().UsedBlocks != 0 {
			t.Errorf("%s: held %v, %d blocks used; want none", r.ID, done.HeldBlocks, e.Stats().UsedBlocks)
		}
	}
	now := 10 * time.Minute
	r := Request{ID: "gone", Tokens: toks(500, 40), MaxTokens: 4, HoldFor: time.Second}
	if err := e.Add(now, &r); err != nil {
		t.Fatal(err)
	}
	e.Step(now)
	e.Cancel(now, "gone")
	if st := e.Stats(); st.UsedBlocks != 0 || st.HeldBlocks != 0 {
		t.Errorf("canceled: %d blocks used, %d held; want none", st.UsedBlocks, st.HeldBlocks)
	}
}

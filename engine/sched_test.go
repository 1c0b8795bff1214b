package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestMaxNumSeqs(t *testing.T) {
	for _, tc := range []struct {
		name                     string
		maxSeqs, n               int
		wantRunning, wantWaiting int
	}{
		{"two seats", 2, 5, 2, 3},
		{"room for all", 8, 5, 5, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := mustNew(t, Config{MaxNumSeqs: tc.maxSeqs})
			for i := range tc.n {
				if err := e.Add(0, &Request{ID: fmt.Sprint(i), Prompt: 100, MaxTokens: 50}); err != nil {
					t.Fatal(err)
				}
			}
			_, next := e.Step(0)
			st := e.Stats()
			if st.Running != tc.wantRunning || st.Waiting != tc.wantWaiting {
				t.Errorf("running %d waiting %d, want %d %d", st.Running, st.Waiting, tc.wantRunning, tc.wantWaiting)
			}
			done := 0
			for next != Idle {
				var evs []Event
				evs, next = e.Step(next)
				if r := e.Stats().Running; r > tc.maxSeqs {
					t.Fatalf("running %d > max %d", r, tc.maxSeqs)
				}
				done += len(doneOf(evs))
			}
			if done != tc.n {
				t.Errorf("%d done, want %d", done, tc.n)
			}
		})
	}
}

// TestChunkedPrefill checks every iteration against the token budget, and
// that running decodes are scheduled before new prefill chunks.
func TestChunkedPrefill(t *testing.T) {
	for _, tc := range []struct {
		name      string
		budget    int
		prompts   []int
		wantSteps int // iterations until the last request's first token
	}{
		{"one prompt", 512, []int{2000}, 4},
		{"two prompts share steps", 512, []int{700, 700}, 3},
		{"budget fits all", 8192, []int{2000, 3000}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := mustNew(t, Config{MaxBatchedTokens: tc.budget})
			for i, p := range tc.prompts {
				if err := e.Add(0, &Request{ID: fmt.Sprint(i), Prompt: p, MaxTokens: 30}); err != nil {
					t.Fatal(err)
				}
			}
			firsts, steps, lastFirst := 0, 0, 0
			for now := time.Duration(0); now != Idle; {
				var evs []Event
				evs, now = e.Step(now)
				for _, ev := range evs {
					if ev.Kind == FirstToken {
						firsts++
						lastFirst = steps
					}
				}
				if now == Idle {
					break
				}
				steps++
				sum, sawPrefill := 0, false
				for _, s := range e.batch {
					sum += s.n
					decode := s.n == 1 && s.output > 0
					if decode && sawPrefill {
						t.Errorf("step %d: decode of %s after a prefill chunk", steps, s.id)
					}
					sawPrefill = sawPrefill || !decode
				}
				if sum > tc.budget {
					t.Errorf("step %d: %d tokens > budget %d", steps, sum, tc.budget)
				}
			}
			if firsts != len(tc.prompts) || lastFirst != tc.wantSteps {
				t.Errorf("%d first tokens, last after %d steps; want %d after %d", firsts, lastFirst, len(tc.prompts), tc.wantSteps)
			}
		})
	}
}

func TestPreemption(t *testing.T) {
	for _, tc := range []struct {
		name            string
		blocks          int
		wantPreemptions bool
	}{
		// Four requests of 100 prompt + 300 output tokens need 25 blocks
		// each; 40 blocks fit them only one or two at a time.
		{"tight", 40, true},
		{"roomy", 200, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := mustNew(t, Config{NumBlocks: tc.blocks})
			var as []arrival
			for i := range 4 {
				as = append(as, arrival{0, Request{ID: fmt.Sprint(i), Tokens: toks(1000*i, 100), MaxTokens: 300}})
			}
			d := doneOf(drive(t, e, as))
			pre := 0
			for i := range 4 {
				ev, ok := d[fmt.Sprint(i)]
				if !ok || ev.OutputTokens != 300 || ev.Canceled {
					t.Errorf("request %d: done %v output %d canceled %v, want 300 tokens", i, ok, ev.OutputTokens, ev.Canceled)
				}
				pre += ev.Preemptions
			}
			st := e.Stats()
			if (pre > 0) != tc.wantPreemptions || int64(pre) != st.Preemptions {
				t.Errorf("preemptions %d (stats %d), want some: %v", pre, st.Preemptions, tc.wantPreemptions)
			}
			if st.UsedBlocks != 0 || st.Running != 0 || st.Waiting != 0 {
				t.Errorf("after all done: %+v", st)
			}
		})
	}
}

func TestCancel(t *testing.T) {
	for _, tc := range []struct {
		name    string
		steps   int           // Steps before the cancel
		early   time.Duration // cancel this long before the iteration ends
		id      string
		wantOK  bool
		wantOut int
	}{
		// Five Steps complete four iterations; the fifth ends at the
		// cancel's time, so Cancel completes it first.
		{"running mid-decode", 5, 0, "a", true, 5},
		// Cancelled during the fifth iteration: its token is discarded.
		{"running in flight", 5, time.Millisecond, "a", true, 4},
		{"waiting", 1, 0, "b", true, 0},
		{"unknown", 1, 0, "zz", false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := mustNew(t, Config{MaxNumSeqs: 1})
			for _, id := range []string{"a", "b"} {
				if err := e.Add(0, &Request{ID: id, Tokens: toks(0, 600), MaxTokens: 100}); err != nil {
					t.Fatal(err)
				}
			}
			now := time.Duration(0)
			for range tc.steps {
				_, now = e.Step(now)
			}
			now -= tc.early
			if ok := e.Cancel(now, tc.id); ok != tc.wantOK {
				t.Fatalf("Cancel = %v, want %v", ok, tc.wantOK)
			}
			if e.Cancel(now, tc.id) {
				t.Errorf("second Cancel = true, want false")
			}
			if st := e.Stats(); tc.id == "a" && st.UsedBlocks != 0 {
				t.Errorf("used %d blocks right after cancelling the only running request, want 0", st.UsedBlocks)
			}

			evs, _ := e.Step(now)
			ev, ok := doneOf(evs)[tc.id]
			if ok != tc.wantOK || ev.Canceled != tc.wantOK || ev.OutputTokens != tc.wantOut {
				t.Errorf("done %v canceled %v output %d, want %v %v %d", ok, ev.Canceled, ev.OutputTokens, tc.wantOK, tc.wantOK, tc.wantOut)
			}
			for now != Idle {
				_, now = e.Step(now)
			}
			if st := e.Stats(); st.UsedBlocks != 0 || st.Running+st.Waiting != 0 {
				t.Errorf("after drain: used %d running %d waiting %d, want 0", st.UsedBlocks, st.Running, st.Waiting)
			}
		})
	}
}

func TestAddErrors(t *testing.T) {
	e := mustNew(t, Config{NumBlocks: 100, MaxModelLen: 1000})
	if err := e.Add(0, &Request{ID: "dup", Prompt: 10, MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		req  Request
	}{
		{"empty prompt", Request{ID: "x", MaxTokens: 1}},
		{"no output", Request{ID: "x", Prompt: 10}},
		{"too long", Request{ID: "x", Prompt: 990, MaxTokens: 20}},
		{"token count mismatch", Request{ID: "x", Prompt: 10, Tokens: toks(0, 5), MaxTokens: 1}},
		{"duplicate id", Request{ID: "dup", Prompt: 10, MaxTokens: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := e.Add(0, &tc.req); err == nil {
				t.Errorf("Add = nil, want an error")
			}
		})
	}
	// The cache (100 blocks = 1600 tokens) caps MaxModelLen too.
	e2 := mustNew(t, Config{NumBlocks: 10})
	if err := e2.Add(0, &Request{ID: "big", Prompt: 150, MaxTokens: 20}); err == nil {
		t.Errorf("request larger than the cache accepted")
	}
}

func TestDeterminism(t *testing.T) {
	workload := func() []arrival {
		var as []arrival
		for i := range 40 {
			as = append(as, arrival{time.Duration(i) * 37 * time.Millisecond, Request{
				ID:        fmt.Sprint(i),
				Tokens:    toks(1000*(i%5), 300+97*(i%7)),
				MaxTokens: 20 + 13*(i%4),
			}})
		}
		return as
	}
	cfg := Config{NumBlocks: 120, MaxNumSeqs: 6, MaxBatchedTokens: 1024}
	a := drive(t, mustNew(t, cfg), workload())
	b := drive(t, mustNew(t, cfg), workload())
	if diff := cmp.Diff(a, b); diff != "" {
		t.Errorf("two runs differ (-first +second):\n%s", diff)
	}
	kinds := map[Kind]int{}
	for _, ev := range a {
		kinds[ev.Kind]++
	}
	for _, k := range []Kind{FirstToken, Token, Done, BlockStored, BlockRemoved} {
		if kinds[k] == 0 {
			t.Errorf("no events of kind %d; the workload should exercise all", k)
		}
	}
}

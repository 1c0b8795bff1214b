package fleet

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/route"
)

// TestTokensTeachDecodeSpread: a streamed request of a long answer
// teaches its replica the spread of its inter-token latency errors from
// its tokens as they stream, after itlGaps gaps and before it is done:
// its stream Calibrator observes 1.5× the model's step, net of the
// prefill that finished during the window and not of the one that
// finished before its second token (it shared the request's last prefill
// iteration), and the replica's DecodeSpread is that Calibrator's while
// DecodeScale stays unlearned (1). Its end then teaches DecodeScale from
// the whole answer, whose Calibrator's spread it is from then on. A
// request not streamed is told of no tokens.
func TestTokensTeachDecodeSpread(t *testing.T) {
	preset := route.Rates{DecodeStep: 10 * time.Millisecond, DecodePerSeq: 100 * time.Microsecond,
		DecodePerMTokens: 50 * time.Millisecond, PrefillPerToken: 50 * time.Microsecond}
	rt := preset.WithDefaults()
	type state struct {
		scale, spread float64
		dcal, scal    int // observations
		scalScale     float64
	}
	look := func(f *Fleet) state {
		var s route.Snapshot
		f.Snapshot(&s, t0, 0)
		r := f.reps[0]
		r.mu.Lock()
		defer r.mu.Unlock()
		return state{s.Replicas[0].Rates.DecodeScale, s.Replicas[0].Rates.DecodeSpread, r.dcal.Observations(), r.scal.Observations(), r.scal.Scale()}
	}
	first := t0.Add(time.Second)
	claim := Claim{Streamed: true, PromptTokens: 1000, Output: 1000}
	prefill := func(f *Fleet, tokens int, at time.Time) time.Duration { // another request's prefill finishes on a at at
		o, _ := f.Acquire(a, Claim{PrefillTokens: tokens}, at)
		o.FirstToken(at)
		o.Done(at, NoUsage, errors.New("leaves no decode"))
		return f.preset.PrefillTime(tokens, 0)
	}

	t.Run("long answer", func(t *testing.T) {
		f := newFleet(t, Config{Rates: preset})
		tk, _ := f.Acquire(a, claim, t0)
		tk.FirstToken(first)
		// A batch of one with a context of its prompt and half its 33 tokens so far.
		gap := time.Duration(1.5 * float64(rt.StepTime(1, 1000+33.0/2)))
		prefill(f, 4000, first.Add(gap/2)) // before its second token: not its stall
		tk.Token(first.Add(gap))
		stall := prefill(f, 2000, first.Add(3*gap/2)) // in its window: its stall
		for k := 2; k < itlGaps; k++ {
			tk.Token(first.Add(time.Duration(k)*gap + stall))
		}
		if s := look(f); s.scal != 0 || s.spread != 0 {
			t.Fatalf("after %d gaps: %+v, want nothing observed and the spread unknown (0)", itlGaps-1, s)
		}
		tk.Token(first.Add(itlGaps*gap + stall))
		s := look(f)
		if s.scal != 1 || s.dcal != 0 || math.Abs(s.scalScale-1.5) > 1e-3 || s.scale != 1 {
			t.Errorf("after %d gaps: %+v, want the stream Calibrator's one observation of 1.5 and DecodeScale unlearned (1)", itlGaps, s)
		}
		if want := route.PriorSpread / math.Sqrt2; math.Abs(s.spread-want) > 1e-12 { // the prior pooled with one observation's nil deviation
			t.Errorf("DecodeSpread %v, want %v", s.spread, want)
		}
		// The whole answer, 999 gaps at 2× the model's step (context: its prompt and half its 1,000 tokens).
		whole := time.Duration(2*float64(rt.StepTime(1, 1000+500))) * 999
		tk.Done(first.Add(whole+stall), Usage{PromptTokens: 1000, CachedTokens: 0, CompletionTokens: 1000}, nil)
		s = look(f)
		if s.dcal != 1 || s.scal != 1 || math.Abs(s.scale-2) > 1e-3 {
			t.Errorf("after Done: %+v, want DecodeScale 2 from the whole answer, each Calibrator one observation", s)
		}
	})

	t.Run("not streamed", func(t *testing.T) {
		f := newFleet(t, Config{Rates: preset})
		c := claim
		c.Streamed, c.PredictedTTFT = false, time.Second
		tk, _ := f.Acquire(a, c, t0)
		tk.FirstToken(first)
		for k := 1; k <= 2*itlGaps; k++ {
			tk.Token(first.Add(time.Duration(k) * time.Second))
		}
		if s := look(f); s.scal != 0 {
			t.Errorf("%+v: a request not streamed observed", s)
		}
	})
}

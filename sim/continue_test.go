package sim

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/trace"
)

// TestKilledStreamsContinue: replica 0 of two dies at 1 s with streams
// decoding on it and a long prompt still in its prefill. As the live
// router does, the simulator releases each as failed and decides it
// again (a StepDone Failed, then a StepArrival to replica 1); a stream
// that had tokens goes on with the prompt plus those tokens as its
// prompt and the rest as its output (the continuation's usage sums to
// the request's), its TTFT the first replica's; the prefill is retried
// whole. With EndStreams (--stream-continue=false) the streams are
// errors and the prefill is still retried.
func TestKilledStreamsContinue(t *testing.T) {
	preset, err := engine.Preset(engine.DefaultPreset)
	if err != nil {
		t.Fatal(err)
	}
	const kill = time.Second
	var reqs []trace.Request
	for k := range 4 { // streams: 400 tokens, each decode step well under 2.5 ms, so mid-answer at 1 s
		reqs = append(reqs, trace.Request{ID: fmt.Sprintf("s%d", k), At: time.Duration(k) * time.Millisecond,
			Segments: []trace.Segment{{ID: uint64(100 + k), Tokens: 512}}, Prompt: 512, Output: 400})
	}
	for k := range 2 { // prefills: arriving 1 ms before the kill with 8k-token prompts
		reqs = append(reqs, trace.Request{ID: fmt.Sprintf("p%d", k), At: kill - time.Millisecond + time.Duration(k)*time.Microsecond,
			Segments: []trace.Segment{{ID: uint64(200 + k), Tokens: 8192}}, Prompt: 8192, Output: 20})
	}
	run := func(end bool) (*result, []Step) {
		var steps []Step
		o, err := simulate(Config{Requests: reqs, Fleet: []trace.FleetEvent{{At: kill, Kind: trace.Kill, Replica: 0}},
			Replicas: 2, Preset: preset, Policies: []string{"round-robin"}, EndStreams: end,
			Trace: func(_ string, s Step) { steps = append(steps, s) }})
		if err != nil {
			t.Fatal(err)
		}
		return o.runs[0], steps
	}
	res, steps := run(false)
	// Which requests ran on replica 0 when it died: those the kill cut.
	cut := map[string]bool{}
	redecided := map[string]int{}
	var usage = map[string][2]int{} // the continuation's prompt and completion tokens
	down := false
	for _, s := range steps {
		switch {
		case s.Kind == StepDown:
			down = true
		case s.Kind == StepDone && s.Failed:
			if !down || s.Replica != 0 || s.At != kill {
				t.Fatalf("%s failed on replica %d at %v, want only replica 0's, at the kill (%v)", s.ReqID, s.Replica, s.At, kill)
			}
			cut[s.ReqID] = true
		case s.Kind == StepArrival && cut[s.ReqID]:
			if s.Decision.Replica != 1 || s.At != kill {
				t.Errorf("%s decided again to replica %d at %v, want replica 1 at %v", s.ReqID, s.Decision.Replica, s.At, kill)
			}
			redecided[s.ReqID]++
		case s.Kind == StepDone && cut[s.ReqID]:
			usage[s.ReqID] = [2]int{s.Usage.PromptTokens, s.Usage.CompletionTokens}
		}
	}
	if len(cut) != 3 {
		t.Fatalf("the kill cut %d requests (%v), want 3: two streams and a prefill", len(cut), cut)
	}
	byID := map[string]*trace.Request{}
	for i := range reqs {
		byID[reqs[i].ID] = &reqs[i]
	}
	streams := 0
	for id := range cut {
		rq := byID[id]
		if redecided[id] != 1 {
			t.Errorf("%s decided again %d times, want once", id, redecided[id])
		}
		u := usage[id]
		if u[0]+u[1] != rq.Prompt+rq.Output {
			t.Errorf("%s: continuation prompt %d + completion %d tokens, want the request's %d + %d", id, u[0], u[1], rq.Prompt, rq.Output)
		}
		if u[0] > rq.Prompt {
			streams++
		} else if u[0] != rq.Prompt {
			t.Errorf("%s retried with a %d-token prompt, want %d", id, u[0], rq.Prompt)
		}
	}
	if streams != 2 {
		t.Errorf("%d continued streams carried tokens into their prompt, want 2", streams)
	}
	ok, rej, errs := res.counts()
	if ok != len(reqs) || rej+errs != 0 {
		t.Errorf("%d served, %d rejected, %d errors; want all %d served", ok, rej, errs, len(reqs))
	}
	for _, s := range res.samples {
		rq := byID[reqIDAt(reqs, s.At)]
		if s.Output != rq.Output || s.Prompt != rq.Prompt {
			t.Errorf("%s: %d prompt, %d output tokens reported, want %d, %d", rq.ID, s.Prompt, s.Output, rq.Prompt, rq.Output)
		}
		if cut[rq.ID] && rq.Prompt == 512 && s.TTFT >= kill {
			t.Errorf("%s: TTFT %v, want the first replica's, before the kill at %v", rq.ID, s.TTFT, kill)
		}
	}

	res, _ = run(true)
	ok, rej, errs = res.counts()
	if ok != len(reqs)-2 || rej != 0 || errs != 2 {
		t.Errorf("with EndStreams: %d served, %d rejected, %d errors; want %d served and the 2 streams errors", ok, rej, errs, len(reqs)-2)
	}
}

// reqIDAt is the id of the request of reqs arriving at t.
func reqIDAt(reqs []trace.Request, t time.Duration) string {
	for i := range reqs {
		if reqs[i].At-reqs[0].At == t {
			return reqs[i].ID
		}
	}
	return ""
}

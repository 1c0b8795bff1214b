// Package trace holds the workloads the simulator and the replay load
// generator run: readers for real traces (Mooncake JSONL, Azure CSV) and
// deterministic generators for the synthetic workloads of
// docs/simulator.md.
//
// Every workload comes out in one form, Request, whose prompt is a sequence
// of Segments. A segment id names a piece of content: equal ids mean equal
// content, and (as with Mooncake's hash_ids) requests that share a leading
// run of segments share that prefix. From the segments the simulator derives
// engine block hashes (Request.Hashes) and the live replay derives real text
// (Request.AppendText), so both see the same reuse.
package trace

import (
	"math"
	"slices"
	"time"

	"github.com/kvrouter/kvrouter/route"
)

// Request is one request of a workload.
type Request struct {
	// ID identifies the request, unique within its workload.
	ID string
	// At is the arrival time, from the start of the trace.
	At time.Duration
	// Session names the conversation or agent run the request belongs to;
	// empty when it has none.
	Session string
	// Tenant names the group, tenant or prefix group of the request; empty
	// when the workload has none. It is informational (charts, checks).
	Tenant string
	// Segments is the prompt, in order; their Tokens sum to Prompt.
	Segments []Segment
	// Prompt is the prompt length in tokens.
	Prompt int
	// Output is the number of tokens to generate (the trace's output
	// length); at least 1 for generated workloads, as read for traces.
	Output int
	// SLO is the request's own SLO class: Class names it (empty: the
	// request has none and is held to the run's SLO), and a zero bound
	// is derived by the simulator from the requests of its class as the
	// run's SLO is from all (sim/slo.go).
	SLO route.SLO `json:",omitzero"`
	// Recorded says the Segments are a recording's blocks (kvrouter serve
	// --record), not a conversation's turns: a replay sends them as one
	// message, not one message each.
	Recorded bool `json:",omitzero"`
}

// Segment is a run of prompt tokens with one identity. Two segments with the
// same ID have the same content: a shorter one is a prefix of a longer one
// (a Mooncake request's last, partial block is the start of the full block
// with the same hash id).
type Segment struct {
	// ID names the content.
	ID uint64
	// Tokens is the segment's length in tokens, at least 1.
	Tokens int
}

// MooncakeBlock is the number of tokens per Mooncake hash id.
const MooncakeBlock = 512

// FleetEventKind says what a FleetEvent does.
type FleetEventKind uint8

// Fleet event kinds.
const (
	// Kill takes replica Replica down at At: the simulator marks it
	// unhealthy, resumes its in-flight requests on other replicas as the
	// live router does (retried before their first token, continued after
	// it) and clears its cache, so the index must forget it.
	Kill FleetEventKind = iota + 1
	// Add brings a new, empty (cold-cache) replica up at At, appended after
	// the existing ones; Replica is -1.
	Add
	// Remove takes replica Replica out of the fleet at At, as the live
	// router's admin API (DELETE) or discovery does: no new request goes
	// to it, those in flight finish on it, and it is gone.
	Remove
)

// String returns "kill", "add" or "remove".
func (k FleetEventKind) String() string {
	switch k {
	case Kill:
		return "kill"
	case Add:
		return "add"
	case Remove:
		return "remove"
	}
	return "unknown"
}

// FleetEvent is a change to the fleet during a run (workload "failure").
type FleetEvent struct {
	// At is when it happens, on the trace's clock (scaled with the requests).
	At   time.Duration
	Kind FleetEventKind
	// Replica is the index of the replica killed (Kill) or removed
	// (Remove), or -1 (Add).
	Replica int
}

// Workload is a named list of requests in arrival order, with the fleet
// events that go with them.
type Workload struct {
	// Name is the workload's name ("shared-prefix", a file's base name, ...).
	Name     string
	Requests []Request
	// Events is nil except for the "failure" workload.
	Events []FleetEvent
}

// Scale multiplies every request's arrival time by factor: 2 halves the
// arrival rate, 0.5 doubles it. Factors ≤ 0 or NaN leave reqs unchanged.
// Use Stats.ScaleFor to compute the factor for a target load.
func Scale(reqs []Request, factor float64) {
	if !(factor > 0) || factor == 1 {
		return
	}
	for i := range reqs {
		reqs[i].At = scaleDur(reqs[i].At, factor)
	}
}

// Scale scales the arrival times of w's requests and fleet events by factor
// (see the function Scale).
func (w *Workload) Scale(factor float64) {
	if !(factor > 0) || factor == 1 {
		return
	}
	Scale(w.Requests, factor)
	for i := range w.Events {
		w.Events[i].At = scaleDur(w.Events[i].At, factor)
	}
}

func scaleDur(d time.Duration, f float64) time.Duration {
	return time.Duration(math.Round(float64(d) * f))
}

// Stats describes a workload's size and offered load.
type Stats struct {
	// Requests is the number of requests.
	Requests int
	// PromptTokens and OutputTokens are totals over all requests.
	PromptTokens, OutputTokens int64
	// Duration is the time from the first arrival to the last.
	Duration time.Duration
	// RequestRate, PromptRate and OutputRate are the offered load in
	// requests/s and tokens/s over Duration (zero when Duration is zero).
	RequestRate, PromptRate, OutputRate float64
	// MaxPrompt is the longest prompt, in tokens.
	MaxPrompt int
}

// Summary returns the statistics of reqs, which must be in arrival order.
func Summary(reqs []Request) Stats {
	var s Stats
	s.Requests = len(reqs)
	if len(reqs) == 0 {
		return s
	}
	for _, r := range reqs {
		s.PromptTokens += int64(r.Prompt)
		s.OutputTokens += int64(r.Output)
		s.MaxPrompt = max(s.MaxPrompt, r.Prompt)
	}
	s.Duration = reqs[len(reqs)-1].At - reqs[0].At
	if sec := s.Duration.Seconds(); sec > 0 {
		s.RequestRate = float64(s.Requests) / sec
		s.PromptRate = float64(s.PromptTokens) / sec
		s.OutputRate = float64(s.OutputTokens) / sec
	}
	return s
}

// ScaleFor returns the factor for Scale that makes the offered prompt load
// promptPerSecond tokens/s. It returns 1 when either rate is unknown.
func (s Stats) ScaleFor(promptPerSecond float64) float64 {
	if s.PromptRate <= 0 || !(promptPerSecond > 0) {
		return 1
	}
	return s.PromptRate / promptPerSecond
}

// sortByArrival orders reqs by arrival time, keeping the order of equal
// times (generators append in a deterministic order).
func sortByArrival(reqs []Request) {
	slices.SortStableFunc(reqs, func(a, b Request) int {
		switch {
		case a.At < b.At:
			return -1
		case a.At > b.At:
			return 1
		}
		return 0
	})
}

// promptOf sums the tokens of segs.
func promptOf(segs []Segment) int {
	n := 0
	for _, s := range segs {
		n += s.Tokens
	}
	return n
}

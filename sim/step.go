package sim

import (
	"slices"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/scrape"
)

// StepKind says what a Step is.
type StepKind uint8

// Step kinds.
const (
	// StepArrival: a request was routed (Request, Route, Snapshot,
	// Decision).
	StepArrival StepKind = iota + 1
	// StepFirstToken: a request's first token came out.
	StepFirstToken
	// StepDone: a request ended (Usage; Failed when its replica died).
	StepDone
	// StepScrape: a replica's metrics reached the fleet (Load).
	StepScrape
	// StepKV: an engine KV event reached the precise index (Event,
	// Hashes).
	StepKV
	// StepDown: a replica went unhealthy.
	StepDown
	// StepAdd: a replica joined (Replica its index, Backend its id and
	// model).
	StepAdd
	// StepRemove: a replica was taken out of the fleet (its requests in
	// flight finish on it).
	StepRemove
	// StepToken: a request's stream delivered an output token after its
	// first (fleet.Ticket.Token).
	StepToken
)

// Step is one thing the router's side of a simulated run did or was told,
// in the order it happened: what the live router would do or be told at
// the same moment (see Config.Trace). Slices are copies the receiver may
// keep.
type Step struct {
	// At is the virtual time; Kind what happened; Replica the replica
	// concerned (by index), ReqID the request concerned.
	At      time.Duration
	Kind    StepKind
	Replica int
	ReqID   string
	// Request is what the fleet was asked to route, Route and Snapshot
	// what the policy saw, Decision what it chose (StepArrival).
	Request  fleet.Request
	Route    route.Request
	Snapshot route.Snapshot
	Decision route.Decision
	// Usage is the engine's usage of a finished request; Failed says its
	// replica died under it (StepDone).
	Usage  fleet.Usage
	Failed bool
	// Load is the scrape (StepScrape).
	Load scrape.Load
	// Event and Hashes are the KV event (StepKV).
	Event  engine.Kind
	Hashes []prefix.Hash
	// Backend and Model are the id and model of a replica that joined
	// (StepAdd).
	Backend, Model string
}

// trace sends s to Config.Trace, if set.
func (r *runner) trace(s Step) {
	if r.cfg.Trace != nil {
		s.At = r.now
		r.cfg.Trace(r.name, s)
	}
}

// traceArrival records a routed request with copies of what the policy
// saw.
func (r *runner) traceArrival(j int, d route.Decision) {
	if r.cfg.Trace == nil {
		return
	}
	req := r.freq
	req.Chains = make([]residency.Chain, len(r.freq.Chains))
	for i, c := range r.freq.Chains {
		req.Chains[i] = residency.Chain{Tokens: c.Tokens, Hashes: slices.Clone(c.Hashes)}
	}
	rr := r.sc.Request
	rr.Match, rr.Age, rr.Costs = slices.Clone(rr.Match), slices.Clone(rr.Age), nil
	snap := r.sc.Snapshot
	snap.Replicas = slices.Clone(snap.Replicas)
	snap.Summary = nil // derived from Replicas, and rewritten by the next decision
	d.Costs = slices.Clone(d.Costs)
	r.trace(Step{Kind: StepArrival, Replica: d.Replica, ReqID: r.jobs[j].id, Request: req, Route: rr, Snapshot: snap, Decision: d})
}

package sim

import (
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/route"
)

// Reasons of the requests admission control rejects, as the live router
// names them (package proxy).
const (
	reasonQueueFull    = "queue-full"
	reasonQueueTimeout = "queue-timeout"
)

// enqueue holds job j, which no replica could take in time, in the
// router's queue; a job the full queue leaves out is rejected.
func (r *runner) enqueue(j int) {
	e := &fleet.Entry[int32]{Value: int32(j), Since: at(r.now)}
	if out := r.wait.Push(e); out != nil {
		r.reject(int(out.Value), -1, reasonQueueFull, rejectPolicy)
	}
}

// admitQueued tries the queued jobs, first first, after a ticket freed
// load: each is decided again until one is still not taken (the fleet
// saturated, or its SLO still predicted missed), which keeps its place.
// A job queued past its patience (fleet.Admission.Patience: the timeout,
// and for one queued for its SLO what remained of its TTFT bound) is
// rejected.
func (r *runner) admitQueued() {
	r.released = false
	for {
		e := r.wait.Pop()
		if e == nil {
			return
		}
		j := int(e.Value)
		jb := &r.jobs[j]
		if at(r.now).Sub(e.Since) > r.cfg.Admission.Patience(r.sloOf(jb), r.queuedForSLO(j), e.Since.Sub(at(jb.at))) {
			r.reject(j, -1, r.expired(j), rejectPolicy)
			continue
		}
		if !r.dispatch(int(e.Value)) {
			r.wait.Push(e)
			return
		}
	}
}

// rejectQueued rejects the jobs still queued when the run ends.
func (r *runner) rejectQueued() {
	for e := r.wait.Pop(); e != nil; e = r.wait.Pop() {
		r.reject(int(e.Value), -1, r.expired(int(e.Value)), rejectPolicy)
	}
}

// expired is the reason of job j's rejection when its wait in the queue
// ran out: route.ReasonUnattainable when it was queued for its SLO, as
// the live router's 429 slo_unattainable.
func (r *runner) expired(j int) string {
	if r.queuedForSLO(j) {
		return route.ReasonUnattainable
	}
	return reasonQueueTimeout
}

// holdForSLO acts on a decision the fleet refused for job j's predicted
// SLO miss (route.ReasonUnattainable, which it answers under
// --slo-admission queue or reject only), as the live router does: reject
// records it rejected and reports true; queue marks it queued for its SLO
// and reports false, so that it waits in the router's queue (enqueue,
// admitQueued) and is decided again against what remains of its TTFT
// bound (remainingSLO).
func (r *runner) holdForSLO(j int) bool {
	if r.cfg.Admission.SLO != fleet.SLOQueue {
		r.reject(j, -1, route.ReasonUnattainable, rejectPolicy)
		return true
	}
	if r.sloQueued == nil {
		r.sloQueued = make([]bool, len(r.jobs))
	}
	r.sloQueued[j] = true
	return false
}

// queuedForSLO reports whether job j was queued for its SLO.
func (r *runner) queuedForSLO(j int) bool {
	return j < len(r.sloQueued) && r.sloQueued[j]
}

// remainingSLO readies job j's decision (r.freq) after it waited in the
// queue for its SLO: its TTFT bound is what remains of it
// (fleet.Remaining), as the live router's re-decision.
func (r *runner) remainingSLO(j int) {
	if r.queuedForSLO(j) {
		r.freq.SLO = fleet.Remaining(r.freq.SLO, r.now-r.jobs[j].at)
	}
}

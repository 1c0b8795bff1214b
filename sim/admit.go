package sim

import "github.com/kvrouter/kvrouter/fleet"

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
// load: each is decided again until one still finds the fleet saturated,
// which keeps its place. A job queued past the timeout is rejected.
func (r *runner) admitQueued() {
	r.released = false
	timeout := r.cfg.Admission.Timeout()
	for {
		e := r.wait.Pop()
		if e == nil {
			return
		}
		if at(r.now).Sub(e.Since) > timeout {
			r.reject(int(e.Value), -1, reasonQueueTimeout, rejectPolicy)
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
		r.reject(int(e.Value), -1, reasonQueueTimeout, rejectPolicy)
	}
}

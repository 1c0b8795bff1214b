package sim

import (
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/trace"
)

// onFleet applies the next fleet event and queues the one after.
//
// Kill: the replica goes unhealthy at once (the live router's health check
// would take a probe interval; the simulator gives every policy the same
// instant knowledge), its requests in flight are resumed on another
// replica as the live router resumes them (continue.go: retried before
// their first token, continued after it), or counted as errors
// (rejectKilled) where the router would give up, and its engine and cache
// are gone. Add: a cold replica joins, appended
// after the others (or in the slot of a removed one whose requests have
// all finished, as the fleet decides). Remove: see remove.
func (r *runner) onFleet() {
	fe := r.cfg.fleet[r.fleet]
	r.fleet++
	if r.fleet < len(r.cfg.fleet) {
		r.q.push(event{at: r.cfg.fleet[r.fleet].at, kind: evFleet})
	}
	switch fe.kind {
	case trace.Kill:
		r.kill(fe.replica)
	case trace.Add:
		if err := r.addReplica(); err != nil {
			r.err = err
		}
	case trace.Remove:
		r.remove(fe.replica)
	}
}

// remove takes replica i out of the fleet through the fleet's own
// RemoveReplica, as the live router's admin API does: no new request goes
// to it, its requests in flight finish on its engine (they are not
// failed), its index entries and sessions are dropped, its KV events stop
// reaching the index (the live router stops its subscriber) and it is no
// longer scraped.
func (r *runner) remove(i int) {
	if i < 0 || i >= len(r.reps) || r.reps[i].removed {
		return
	}
	rp := &r.reps[i]
	rp.removed = true
	r.each(func(f *fleet.Fleet) {
		if _, err := f.RemoveReplica(rp.id); err != nil && r.err == nil {
			r.err = err
		}
	})
	if r.err != nil {
		return
	}
	r.trace(Step{Kind: StepRemove, Replica: i})
	for k := r.kvq0; k < len(r.kvq); k++ {
		if r.kvq[k].rep == int32(i) {
			r.kvq[k].rep, r.kvq[k].hashes = -1, nil
		}
	}
}

// kill takes replica i down.
func (r *runner) kill(i int) {
	if i < 0 || i >= len(r.reps) || !r.reps[i].alive {
		return
	}
	rp := &r.reps[i]
	eng := rp.eng
	rp.alive, rp.eng, rp.wake = false, nil, -1
	cut := r.harvest(i, eng)
	r.each(func(f *fleet.Fleet) { f.SetHealthy(rp.id, false) })
	r.trace(Step{Kind: StepDown, Replica: i})
	for j := range r.flights {
		f := &r.flights[j]
		if f.active && int(f.leg) == i {
			r.failLeg(j)
			continue
		}
		if f.active && f.leg < 0 && int(f.rep) == i {
			r.cut(j, i, cut[j])
		}
	}
}

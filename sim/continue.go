package sim

import (
	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/route"
)

// A request whose replica dies under it is resumed on another, as the
// live router resumes it (proxy/transport.go, proxy/continue.go):
//
//   - before its first token nothing reached the client, so the router
//     retries the request elsewhere (at most proxy.DefaultRetries times);
//   - after it, with --stream-continue (the router's default; Config.
//     EndStreams turns it off), the router continues the stream: the
//     prompt plus the tokens generated so far go to another replica,
//     which prefills them all and generates the rest (max_tokens less
//     what was sent), at most proxy.DefaultRetries times.
//
// Either way the router releases the dead replica's ticket as failed
// and decides again, through the same fleet.Decide with the same request
// and the dead replica excluded. A retry runs as a new request does, a
// transfer the decision orders included (proxy/transfer.go: a new
// prefill leg); a continuation goes straight to the replica chosen and
// carries no KV transfer (the proxy strips it: untransferred). No replica able to take it (a rejection or a full
// fleet) ends it with an error, as the router's repick does. The client
// saw its first token once: the sample's TTFT is the first replica's,
// its output every token of both, its ITL their mean gap.

// maxResumes is how many times a request is retried, or its stream
// continued, after a replica died: the live router's default
// (proxy.DefaultRetries; its --retries).
const maxResumes = 2

// harvest ends every request of eng, the engine of replica i, which
// died at now, and returns what each had generated, by job; a request
// the engine finished by now (its last iteration ended then) is handed
// on as finished, and a prefill leg finished then hands its request to
// its decode replica, which, its source being dead, computes the prompt.
func (r *runner) harvest(i int, eng *engine.Engine) map[int]engine.Event {
	var ids []string
	for j := range r.flights {
		if f := &r.flights[j]; f.active && f.leg < 0 && int(f.rep) == i {
			ids = append(ids, r.jobs[j].id)
		}
	}
	for _, id := range ids {
		eng.Cancel(r.now, id)
	}
	evs, _ := eng.Step(r.now)
	done := map[int]engine.Event{}
	for k := range evs {
		ev := &evs[k]
		switch {
		case ev.Kind == engine.Done && ev.Canceled:
			if j, ok := r.byID[ev.Req]; ok && r.jobs[j].id == ev.Req {
				done[int(j)] = *ev
			}
		case ev.Kind == engine.FirstToken || ev.Kind == engine.Done:
			r.onEngine(i, ev) // its iteration ended by now: it reached the client
		}
	}
	return done
}

// cut ends job j, running on replica i, which died at now having
// generated ev.OutputTokens for it (harvest), and resumes it elsewhere
// when the router would.
func (r *runner) cut(j, i int, ev engine.Event) {
	jb, f := &r.jobs[j], &r.flights[j]
	f.active = false
	f.ticket.Done(at(r.now), fleet.NoUsage, errKilled)
	r.trace(Step{Kind: StepDone, Replica: i, ReqID: jb.id, Usage: fleet.NoUsage, Failed: true})
	delete(r.byID, jb.id)
	if ev.OutputTokens > 0 && !f.seen {
		f.first, f.seen = ev.First, true
	}
	f.sent += ev.OutputTokens
	retry := f.sent == 0 && f.retried < maxResumes
	cont := f.sent > 0 && f.sent < jb.output && !r.cfg.EndStreams && f.continued < maxResumes
	if !retry && !cont {
		r.live--
		r.reject(j, i, f.reason, rejectKilled)
		return
	}
	if retry {
		f.retried++
	} else {
		f.continued++
	}
	r.resume(j, i)
}

// resume decides job j again without replica failed, as the live
// router's repick does, and sends what is left of it to the replica
// chosen (start: the prompt plus the tokens sent, for the rest).
func (r *runner) resume(j, failed int) {
	jb, f := &r.jobs[j], &r.flights[j]
	r.request(j)
	r.freq.Admitted = true // admitted on its first decision, as a live retry
	fl, sc, k := r.router(j)
	r.readSession(j, k, fl)
	d, tk := fl.Decide(&r.freq, []int{failed}, at(r.now), sc)
	if tk != nil {
		r.writeSession(j, k, d.Replica)
	}
	r.traceArrival(j, d)
	if tk == nil {
		r.live--
		r.reject(j, failed, f.reason, rejectKilled)
		return
	}
	f.rep, f.ticket, f.reason, f.predicted = int32(d.Replica), tk, d.Reason, min(d.Matched, jb.prompt)
	if f.sent > 0 {
		r.start(j, route.Transfer{})
		return
	}
	if !r.store && r.startLeg(j, d.Transfer, fl, sc) {
		return
	}
	r.start(j, d.Transfer)
}

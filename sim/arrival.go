package sim

import (
	"errors"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/route"
)

// Errors a ticket is released with.
var (
	errEngineRefused = errors.New("engine refused the request")
	errKilled        = errors.New("replica killed")
)

// onArrival routes job j through the fleet and hands it to the chosen
// engine.
func (r *runner) onArrival(j int) {
	if j == r.next {
		r.next++
		if r.next < len(r.jobs) {
			r.q.push(event{at: r.jobs[r.next].at, kind: evArrival, idx: int32(r.next)})
		}
	}
	if !r.dispatch(j) {
		r.enqueue(j)
	}
}

// dispatch routes job j through the fleet and hands it to the chosen
// engine; admission control may queue it instead (enqueue). It reports
// false when the fleet was saturated for it, or refused it for its SLO
// under --slo-admission queue.
func (r *runner) dispatch(j int) bool {
	jb := &r.jobs[j]
	r.request(j)
	r.remainingSLO(j)
	fl, sc, k := r.router(j)
	r.readSession(j, k, fl)
	d, tk := fl.Decide(&r.freq, nil, at(r.now), sc)
	if tk != nil {
		r.writeSession(j, k, d.Replica)
	}
	r.traceArrival(j, d)
	if tk == nil && d.Reason == route.ReasonSaturated {
		return false
	}
	if tk == nil && d.Reason == route.ReasonUnattainable {
		return r.holdForSLO(j)
	}
	if tk == nil {
		r.reject(j, -1, d.Reason, rejectPolicy)
		return true
	}
	r.flights[j] = flight{rep: int32(d.Replica), leg: -1, ticket: tk, predicted: min(d.Matched, jb.prompt), reason: d.Reason}
	r.live++
	if !r.store && r.startLeg(j, d.Transfer, fl, sc) {
		return true
	}
	r.start(j, d.Transfer)
	return true
}

// request sets r.freq to what the fleet is asked to route for job j.
func (r *runner) request(j int) {
	jb := &r.jobs[j]
	r.chains[0].Tokens, r.chains[0].Hashes = r.cfg.Preset.BlockSize, jb.hashes
	r.freq = fleet.Request{ID: jb.id, Hash: jb.hash, Model: jb.model, Session: jb.session,
		Tokens: jb.prompt, MaxTokens: jb.output, PrefixKey: jb.prefixKey, Chains: r.chains[:], TTFT: true,
		SLO: r.sloOf(jb)}
}

// sloOf is job jb's SLO: its class's, else the run's.
func (r *runner) sloOf(jb *job) route.SLO {
	if jb.slo.Class != "" {
		return jb.slo
	}
	return route.SLO{TTFT: r.cfg.SLO.TTFT, ITL: r.cfg.SLO.ITL}
}

// start hands job j, routed and charged (r.flights[j]), to its replica's
// engine, importing transfer t's blocks first if it orders any; a job
// resumed after its replica died (continue.go) brings the tokens already
// sent as prompt and asks for the rest.
func (r *runner) start(j int, t route.Transfer) {
	jb, f := &r.jobs[j], &r.flights[j]
	i := int(f.rep)
	rp := &r.reps[i]
	er := &r.ereq[j]
	*er = engine.Request{ID: jb.id, Prompt: jb.prompt + f.sent, Hashes: jb.hashes, MaxTokens: jb.output - f.sent}
	r.importFrom(t, er, jb, i)
	// A replica that does not serve the model answers 404, as an engine
	// does: an error the policy caused.
	if !rp.alive || rp.model != jb.model || rp.eng.Add(r.now, er) != nil {
		f.ticket.Done(at(r.now), fleet.NoUsage, errEngineRefused)
		r.trace(Step{Kind: StepDone, Replica: i, ReqID: jb.id, Usage: fleet.NoUsage, Failed: true})
		r.live--
		r.reject(j, i, f.reason, rejectEngine)
		return
	}
	f.active = true
	r.byID[jb.id] = int32(j)
	if rp.wake < 0 || !rp.eng.Busy() {
		r.step(i) // an engine waiting only for loads admits it now, as the emulator's does
	}
}

// importFrom makes er, bound for replica dst, import transfer t's blocks,
// as the emulated engine asks its peer for them: the source sends what
// its GPU cache still holds of them past what dst's holds, after what its
// link sends already. A source that holds no more sends nothing, and the
// request computes the rest. Transfers are counted when they arrive
// (onDone).
func (r *runner) importFrom(t route.Transfer, er *engine.Request, jb *job, dst int) {
	if t.Blocks <= 0 || t.From < 0 || t.From >= len(r.reps) || !r.reps[t.From].alive {
		return
	}
	want := jb.hashes[:min(t.Blocks, len(jb.hashes))]
	src, have := r.reps[t.From].eng, r.reps[dst].eng.Holds(want)
	n := src.Holds(want)
	if n <= have {
		return
	}
	er.RemoteBlocks, er.RemoteSent = n, src.Send(r.now, n-have)
}

// reject records job j as not served: rejected by the policy, refused by
// replica i's engine or failed with replica i (errors).
func (r *runner) reject(j, i int, reason string, cause int) {
	jb := &r.jobs[j]
	s := report.Sample{At: jb.at, Prompt: jb.prompt, Replica: i, Reason: reason, Rejected: cause == rejectPolicy}
	s.Class, s.SLO = classOf(jb)
	s.SLOQueued = r.queuedForSLO(j)
	if cause == rejectKilled {
		s.E2E = r.now - jb.at
	}
	r.res.samples = append(r.res.samples, s)
	r.progress()
}

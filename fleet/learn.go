package fleet

import (
	"time"

	"github.com/kvrouter/kvrouter/route"
)

// A policy that learns from its requests' latencies (route.Learner, such
// as llm-d-predicted's online predictor) gets them here, from the same
// tickets the live router and the simulator hold: the decision's
// features are kept in the ticket when it is committed, and handed back
// with the observed TTFT and TPOT when the request completes.

// newTicket is a new zero ticket for a decision: a learnedTicket's under
// a learning policy, with room for its features; a plain one otherwise.
func (f *Fleet) newTicket() *Ticket {
	if _, ok := f.policy.(route.Learner); ok {
		lt := new(learnedTicket)
		lt.ext.learned = true
		lt.Ticket.ext = &lt.ext
		return &lt.Ticket
	}
	return new(Ticket)
}

// noteFeatures keeps in tk, made by newTicket, what the fleet's learning
// policy takes of decision d over the scratch's snapshot and request;
// nothing for a policy that does not learn.
func (f *Fleet) noteFeatures(tk *Ticket, d route.Decision, sc *Scratch) {
	if l, ok := f.policy.(route.Learner); ok && tk.ext != nil && tk.ext.learned {
		tk.ext.features = l.Features(&sc.Request, &sc.Snapshot, d)
	}
}

// teach hands the fleet's learning policy what the completed request
// saw at now: its time to first token, from the decision, and its mean
// time per output token after the first, over the output tokens the
// engine reported (else the ones it asked for). A request whose first
// token was not seen (not streamed) teaches nothing.
func (t *Ticket) teach(now time.Time, u Usage) {
	l, ok := t.f.policy.(route.Learner)
	first := t.first.Load()
	if !ok || t.ext == nil || !t.ext.learned || first == 0 {
		return
	}
	o := route.Observation{Features: t.ext.features, TTFT: time.Duration(first - 1), At: t.f.indexTime(now)}
	out := u.CompletionTokens
	if out < 0 {
		out = t.claim.Output
	}
	if decode := now.Sub(t.sent) - o.TTFT; out >= 2 && decode > 0 {
		o.TPOT = decode / time.Duration(out-1)
	}
	l.Observe(o)
}

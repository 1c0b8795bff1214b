package proxy

import (
	"context"
	"errors"
	"time"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/view"
)

// Errors a ticket is released with, for the fleet's failure counts.
var (
	errUpstreamFailed = errors.New("upstream failed")
	errRouterAnswered = errors.New("router answered with an error")
	errRetried        = errors.New("retried on another replica")
)

// firstByte runs when the first response byte arrives from the upstream:
// prefill is over, and for a streamed response the time since the replica
// was chosen is its observed TTFT, which calibrates the replica's rates
// against the decision's prediction (fleet.Ticket.FirstToken).
func (c *call) firstByte(at time.Time) {
	if !c.routed || c.status >= 300 {
		return
	}
	c.ticket.FirstToken(at)
}

// token runs at each streamed output token after the first: the
// replica's inter-token latency is learned from the stream as it goes
// (fleet.Ticket.Token).
func (c *call) token(at time.Time) {
	if c.routed && c.status < 300 {
		c.ticket.Token(at)
	}
}

// finish settles the call on every path: releases the replica's load,
// feeds passive health, records metrics, completes the decision record,
// logs the access line and ends the server span. It runs once, when the handler returns (also when it
// panics with http.ErrAbortHandler after a mid-stream failure).
func (c *call) finish(ctx context.Context) {
	rt := c.rt
	c.waitSession()
	c.end = rt.now()
	c.outcome = c.outcomeOf(ctx)
	if c.tapped {
		if c.tap.HasUsage {
			c.usage = fleet.Usage{PromptTokens: c.tap.Usage.PromptTokens, CachedTokens: c.tap.Usage.Cached(),
				CompletionTokens: c.tap.Usage.Completion()}
		}
		if !c.tap.First.IsZero() {
			c.ttft = c.tap.First.Sub(c.start)
		}
		if c.resp != nil {
			c.resp.finish(c)
		}
	}
	if c.replica >= 0 {
		c.settle()
	}
	c.settleDecode()
	c.judgeSLO()
	if c.rec != 0 {
		c.record()
	}
	if r := rt.rec.on.Load(); r != nil && c.freq.ID != "" {
		c.recordTrace(r)
	}
	c.giveBody()
	rt.observe(c)
	rt.observeSLO(c)
	rt.logAccess(c)
	c.endSpan()
	rt.recycle(c)
}

// outcomeOf classifies how the call ended. A stream that delivered its
// end ([DONE], or a finish_reason) is ok whatever the client did next;
// one that ended before, without the client going away first, was cut by
// the replica.
func (c *call) outcomeOf(ctx context.Context) string {
	switch {
	case c.errCode != "":
		return view.OutcomeError
	case c.tapped && c.tap.SSE && c.tap.Ended && !c.tap.ErrEvent:
		return view.OutcomeOK
	case ctx.Err() != nil:
		return view.OutcomeCanceled
	case c.tapped && (c.tap.Cut || c.tap.Err != nil || c.tap.ErrEvent), c.status >= 500:
		return view.OutcomeUpstreamError
	}
	return view.OutcomeOK
}

// settle releases the ticket at the call's end, feeds health and records
// the metrics of a call that reached a replica.
func (c *call) settle() {
	rt := c.rt
	switch c.outcome {
	case view.OutcomeOK:
		c.ticket.Done(c.end, c.usage, nil)
		rt.st.reportSuccess(c.replica)
	case view.OutcomeCanceled: // not the replica's fault
		c.ticket.Done(c.end, fleet.NoUsage, nil)
	case view.OutcomeUpstreamError:
		c.ticket.Done(c.end, fleet.NoUsage, errUpstreamFailed)
		rt.st.reportFailure(c.replica)
		if c.tapped && c.tap.Cut {
			rt.m.errors.WithLabelValues(c.tap.CutCode).Inc()
		}
	default:
		c.ticket.Done(c.end, fleet.NoUsage, errRouterAnswered)
		if c.errCode == "upstream_unreachable" {
			rt.st.reportFailure(c.replica)
		}
	}
	name := rt.name(c.replica)
	if c.routed {
		rt.m.requests.WithLabelValues(name, rt.policyName, c.dec.Reason).Inc()
		// The three totals cover the same requests, those whose usage
		// reported both: their ratios are hit rates (see view.Replica).
		if u := c.usage; u.CachedTokens >= 0 && u.PromptTokens > 0 {
			claim := c.ticket.Claim()
			rt.m.predicted.WithLabelValues(name).Add(float64(claim.PredictedOf(u.PromptTokens)))
			rt.m.actual.WithLabelValues(name).Add(float64(u.CachedTokens))
			rt.m.prompt.WithLabelValues(name).Add(float64(u.PromptTokens))
		}
	}
}

// recycle returns c to the pool unless the upstream transport may still
// read its body (it had not read it to the end, or a retry replayed it
// through GetBody), or a Pick holds it: then the garbage collector takes
// it.
func (rt *Router) recycle(c *call) {
	if c.rb.r.Size() > 0 && !c.rb.eof.Load() || len(c.failed) > 0 || c.picked {
		return
	}
	rt.putCall(c)
}

// putCall empties c, keeping its buffers, and returns it to the pool.
func (rt *Router) putCall(c *call) {
	b := c.bufs
	b.borrow(nil) // emptied now: a buffer past keepBytes is not kept in the pool
	b.tap.Body, b.tap.OnFirst, b.tap.OnToken = nil, nil, nil
	*c = call{bufs: b} // holds nothing of the request
	rt.pool.Put(c)
}

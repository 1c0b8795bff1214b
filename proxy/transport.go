package proxy

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/fleet"
)

// retrier is the ReverseProxy's transport. It sends the request to the
// call's replica and, while no response byte has reached the client,
// retries on another replica after a connection error, a timeout, a 5xx
// answer (500 included: some engines answer it when their KV cache is
// full), or a stream that failed before its first content event: for a
// routed stream the router commits to a replica only when the first token
// arrives (stream.readAhead), so that a request queued inside a dying
// engine is retried elsewhere, and a non-streaming answer is read whole
// (up to Config.RetryBufferBytes) before the client gets any of it. A
// retry marks the failure (passive health; a refused connection ejects the
// replica at once), releases the replica, re-picks with the failed
// replicas excluded and replays the body through GetBody. It never retries
// after the client went away. When the last replica tried timed out, the
// client gets an OpenAI-shaped 504.
type retrier struct{ rt *Router }

// RoundTrip implements http.RoundTripper.
func (t retrier) RoundTrip(req *http.Request) (*http.Response, error) {
	rt := t.rt
	c := callFrom(req.Context())
	if c == nil {
		return rt.upstream.RoundTrip(req)
	}
	for attempt := 0; ; attempt++ {
		resp, err := c.try(req)
		c.decodeFailed(req, err)
		if !retryable(resp, err) || req.Context().Err() != nil || attempt >= rt.cfg.Retries || !replayable(req) {
			return c.answer(req, resp, err)
		}
		rt.m.retries.WithLabelValues(rt.name(c.replica)).Inc()
		rt.log.Info("retrying on another replica", "id", c.id, "failed", rt.name(c.replica), "err", errString(resp, err))
		c.abandon(err, errRetried)
		if !c.repick() && !c.holdForService(req.Context(), err) {
			return c.answer(req, resp, err)
		}
		next := req.Clone(req.Context())
		if req.GetBody != nil {
			body, gerr := req.GetBody()
			if gerr != nil {
				return nil, gerr
			}
			next.Body = body
		}
		if !c.redo(next) {
			return c.answer(req, resp, err)
		}
		if resp != nil {
			drain(resp)
		}
		u := *rt.url(c.replica)
		u.Path, u.RawPath, u.RawQuery = req.URL.Path, req.URL.RawPath, req.URL.RawQuery
		next.URL = &u
		next.Host = ""
		req = next
	}
}

// try sends req once, within the timeouts: for a routed stream it reads
// ahead to the first content event (within Config.TTFTTimeout) and then
// watches the gaps (Config.StreamIdleTimeout); a routed non-streaming
// answer is read whole up to Config.RetryBufferBytes. An error means that
// nothing of the attempt can reach the client.
func (c *call) try(req *http.Request) (*http.Response, error) {
	rt := c.rt
	var first time.Duration
	if c.routed && c.prompt != nil && c.prompt.Stream {
		first = rt.cfg.TTFTTimeout
	}
	a := c.newAttempt(req.Context(), first)
	resp, err := rt.upstream.RoundTrip(req.WithContext(a.ctx))
	if err != nil {
		a.stop()
		return nil, c.counted(a.fault(err))
	}
	if bad := c.judgeType(resp); bad != nil { // judge.go
		drain(resp)
		a.stop()
		return nil, c.invalid(bad)
	}
	switch {
	case c.resp != nil: // a Responses answer: neither chat chunks nor choices (responses.go)
		a.streaming()
		resp.Body = &body{rc: resp.Body, a: a}
	case resp.StatusCode == http.StatusOK && c.routed && isSSE(resp):
		s := newStream(c, req, a, resp.Body)
		if err := s.readAhead(); err != nil {
			s.Close()
			return nil, c.counted(err)
		}
		if bad := judgeStream(s); bad != nil {
			s.Close()
			return nil, c.invalid(bad)
		}
		resp.Body = s
	case resp.StatusCode == http.StatusOK && c.routed && rt.cfg.RetryBufferBytes > 0:
		var err error
		if c.whole, err = readWhole(resp, a, rt.cfg.RetryBufferBytes, c.whole[:0]); err != nil {
			return nil, c.counted(err)
		}
		if bad := judgeJSON(resp, &c.tap); bad != nil {
			resp.Body.Close()
			return nil, c.invalid(bad)
		}
	default:
		a.streaming()
		resp.Body = &body{rc: resp.Body, a: a}
	}
	return resp, nil
}

// counted counts err in kvrouter_upstream_timeouts_total when it is a
// timeout, and returns it.
func (c *call) counted(err error) error {
	if kind := timeoutKind(err); kind != "" {
		c.rt.m.timeouts.WithLabelValues(kind).Inc()
	}
	return err
}

// answer is what RoundTrip returns after its last attempt: an
// OpenAI-shaped 504 for a timeout, else the attempt's own result. A
// replica that refused the connection is ejected.
func (c *call) answer(req *http.Request, resp *http.Response, err error) (*http.Response, error) {
	if err == nil || req.Context().Err() != nil {
		return resp, err
	}
	if isDialError(err) {
		c.rt.st.eject(c.replica, err.Error())
	}
	if timeoutKind(err) != "" {
		c.rt.m.errors.WithLabelValues(codeUpstreamTimeout).Inc()
		return timeoutResponse(req, err), nil
	}
	if isInvalid(err) {
		c.rt.m.errors.WithLabelValues(codeUpstreamInvalid).Inc()
		return upstreamResponse(req, http.StatusBadGateway, codeUpstreamInvalid, "no replica gave a valid answer: "+err.Error()), nil
	}
	return resp, err
}

// abandon gives up the call's replica after err: passive health hears of
// it (a refused connection ejects the replica at once), its ticket is
// released with ticketErr and it joins the replicas the call excludes.
func (c *call) abandon(err, ticketErr error) {
	rt := c.rt
	failed := c.replica
	if isDialError(err) {
		rt.st.eject(failed, err.Error())
	} else {
		rt.st.reportFailure(failed)
	}
	c.failed = append(c.failed, failed)
	c.ticket.Done(rt.now(), fleet.NoUsage, ticketErr)
	c.ticket = nil
}

// repick chooses another replica for a call whose replica failed. For a
// routed call it runs the policy again; for a pass-through it takes any
// other healthy replica.
func (c *call) repick() bool {
	if c.routed {
		return c.pick(nil)
	}
	return c.passTo(c.rt.anyHealthy(c.failed))
}

// holdForService is the retry of an attempt whose replica failed probes
// ejected (err) when no other is in service: every engine stalled at once
// (CPU starvation of their host), the others' probes failing a moment
// after its own. The request waits, counted as a stall hold, for a
// replica to return to service, and picks again among all of them (a
// stall is no fault of the replica's), up to the first-token timeout; it
// reports whether it was given a replica.
func (c *call) holdForService(ctx context.Context, err error) bool {
	rt := c.rt
	d := rt.cfg.TTFTTimeout
	if timeoutKind(err) != timeoutProbe || d <= 0 {
		return false
	}
	rt.m.stallHolds.Inc()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		back := rt.st.backSignal()
		c.failed = c.failed[:0]
		if c.repick() {
			return true
		}
		select {
		case <-back:
		case <-deadline.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// retryable reports whether an attempt failed before the replica started
// answering: a transport error, or 500, 502, 503 or 504. Other statuses
// (a 4xx about the request, 501 and above 504) would repeat anywhere.
func retryable(resp *http.Response, err error) bool {
	if err != nil {
		return true
	}
	switch resp.StatusCode {
	case http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

func errString(resp *http.Response, err error) string {
	if err != nil {
		return err.Error()
	}
	return resp.Status
}

// replayable reports whether req's body can be sent again.
func replayable(req *http.Request) bool {
	return req.GetBody != nil || req.Body == nil || req.Body == http.NoBody
}

// copyBufSize is the size of the buffers ReverseProxy copies response
// bodies through (its own default).
const copyBufSize = 32 << 10

// bufferPool is ReverseProxy's BufferPool: without one it allocates a
// 32 KiB buffer per response. Buffers travel as array pointers so that
// Get and Put allocate nothing.
type bufferPool struct{ p sync.Pool }

// Get returns a copyBufSize buffer.
func (b *bufferPool) Get() []byte {
	if a, ok := b.p.Get().(*[copyBufSize]byte); ok {
		return a[:]
	}
	return new([copyBufSize]byte)[:]
}

// Put returns a buffer Get gave out; others are dropped.
func (b *bufferPool) Put(buf []byte) {
	if len(buf) == copyBufSize {
		b.p.Put((*[copyBufSize]byte)(buf))
	}
}

package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Timeout kinds, the values of kvrouter_upstream_timeouts_total's kind
// label.
const (
	timeoutConnect = "connect" // Config.ConnectTimeout
	timeoutTTFT    = "ttft"    // Config.TTFTTimeout
	timeoutIdle    = "idle"    // Config.StreamIdleTimeout
	timeoutTotal   = "total"   // Config.RequestTimeout
	// timeoutProbe: the replica was ejected by failed probes while the
	// attempt waited for its answer or first token.
	timeoutProbe = "probe"
)

// Error codes of the upstream failures the router reports to clients.
const (
	codeUpstreamTimeout = "upstream_timeout"
)

// timeoutError is the cause an attempt's context is cancelled with when
// one of its timers fires.
type timeoutError struct {
	kind string
	d    time.Duration
	flag string
}

func (e *timeoutError) Error() string {
	switch e.kind {
	case timeoutTTFT:
		return fmt.Sprintf("no first token from the replica within %v (--%s)", e.d, e.flag)
	case timeoutIdle:
		return fmt.Sprintf("the replica sent nothing for %v (--%s)", e.d, e.flag)
	case timeoutProbe:
		return "the replica stopped answering its health probes while the request waited"
	}
	return fmt.Sprintf("the request took longer than %v (--%s)", e.d, e.flag)
}

// Timeout reports true, as net.Error's Timeout does.
func (e *timeoutError) Timeout() bool { return true }

// upstreamError is an attempt that failed in the router's eyes although
// the transport may have had no error: a timeout, a stream cut before its
// end, an error event. Code is the error code the client sees, Kind the
// timeout kind ("" when not a timeout).
type upstreamError struct {
	code, kind string
	err        error
}

func (e *upstreamError) Error() string { return e.err.Error() }
func (e *upstreamError) Unwrap() error { return e.err }

// Code is the error code of the event that ends the stream (sse.Tap).
func (e *upstreamError) Code() string { return e.code }

// attempt is one upstream try: a context its timers cancel, with the
// timeout as cause. The phase timer bounds the time to the first token,
// then the gaps between reads; the total timer bounds the whole call.
type attempt struct {
	parent context.Context // the request's own
	ctx    context.Context
	cancel context.CancelCauseFunc
	phase  *time.Timer // nil without a phase timeout
	total  *time.Timer // nil without a request timeout
	// idle is the stream's silence limit (a time.Duration): the
	// stream-idle timeout, or ejectedIdle once probes ejected its replica
	// (quick set); streamed is the phase timer once it bounds the silence
	// (streaming), for the watch goroutine.
	idle     atomic.Int64
	quick    atomic.Bool
	streamed atomic.Pointer[time.Timer]
	rt       *Router
	span     trace.Span // the attempt's client span; nil when tracing is off
	// answered is set once the first token (or a non-streaming answer's
	// headers) arrived: a probe ejection no longer cancels the attempt.
	answered atomic.Bool
	// mu guards unwatch, which stops the watch on the replica's next
	// ejection (nil: none), and stopped, set by stop.
	mu      sync.Mutex
	unwatch func() bool
	stopped bool
}

// newAttempt starts an attempt for c under parent. first bounds the time
// to the first token (zero: no bound); once it arrives, tick moves the
// phase timer to the stream-idle timeout.
func (c *call) newAttempt(parent context.Context, first time.Duration) *attempt {
	rt := c.rt
	spanCtx, span := c.startAttempt(parent)
	ctx, cancel := context.WithCancelCause(spanCtx)
	a := &attempt{parent: parent, ctx: ctx, cancel: cancel, rt: rt, span: span}
	a.idle.Store(int64(rt.cfg.StreamIdleTimeout))
	if first > 0 {
		a.phase = time.AfterFunc(first, func() { cancel(&timeoutError{kind: timeoutTTFT, d: first, flag: "ttft-timeout"}) })
	}
	if d := rt.cfg.RequestTimeout; d > 0 {
		left := time.Until(c.start.Add(d))
		a.total = time.AfterFunc(max(left, 0), func() { cancel(&timeoutError{kind: timeoutTotal, d: d, flag: "request-timeout"}) })
	}
	if c.replica >= 0 && c.routed {
		a.watch(c.replica)
	}
	return a
}

// watch cancels the attempt if failed probes eject its replica i before
// its answer arrived, so that it is retried elsewhere at once instead of
// at its timeout, until the attempt ends (stop). When no other replica
// is in service either (every engine stalled at once: CPU starvation of
// their host, a paused node), there is nowhere to retry: the attempt is
// held on its replica, whose answer may still come, until its first-token
// timeout (TestFleetStall). It waits with a callback on the replica's
// hung signal, not a goroutine: an attempt costs none until an ejection.
func (a *attempt) watch(i int) {
	st := a.rt.st
	sig := st.hungSignal(i)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopped {
		return
	}
	a.unwatch = context.AfterFunc(sig, func() {
		if a.ctx.Err() != nil {
			return
		}
		if a.answered.Load() {
			a.quicken(i)
			return
		}
		if st.otherHealthy(i) {
			a.cancel(&timeoutError{kind: timeoutProbe})
			return
		}
		// Held: wait for the answer, or for the next ejection of i
		// (probes readmitted it meanwhile).
		a.rt.m.stallHolds.Inc()
		a.watch(i)
	})
}

// ejectedIdle is the silence after which a stream past its first token
// is given up once failed probes ejected its replica (a stopped engine):
// it is then continued elsewhere without waiting out the stream-idle
// timeout. A replica streaming at all sends far more often.
const ejectedIdle = time.Second

// streaming moves the phase timer to the stream-idle timeout: the first
// token arrived.
func (a *attempt) streaming() {
	idle := time.Duration(a.idle.Load())
	if idle <= 0 {
		if a.phase != nil {
			a.phase.Stop()
		}
		a.phase = nil
		a.answered.Store(true)
		return
	}
	if a.phase != nil {
		a.phase.Stop()
	}
	a.phase = time.AfterFunc(idle, func() { a.cancel(a.idleCause()) })
	a.streamed.Store(a.phase)
	a.answered.Store(true)
}

// idleCause is why a silent stream is given up: its replica's silence
// past the stream-idle timeout, or past ejectedIdle once probes ejected
// it.
func (a *attempt) idleCause() error {
	if a.quick.Load() {
		return &timeoutError{kind: timeoutProbe}
	}
	return &timeoutError{kind: timeoutIdle, d: a.rt.cfg.StreamIdleTimeout, flag: "stream-idle-timeout"}
}

// quicken bounds the silence of a stream whose replica i failed probes
// ejected to ejectedIdle, when another replica can continue it: a stopped
// engine's streams move on within a second of its ejection, not at the
// stream-idle timeout. A stream still flowing is not cut.
func (a *attempt) quicken(i int) {
	t := a.streamed.Load()
	if t == nil || time.Duration(a.idle.Load()) <= ejectedIdle || !a.rt.st.otherHealthy(i) {
		return
	}
	a.quick.Store(true)
	a.idle.Store(int64(ejectedIdle))
	t.Reset(ejectedIdle)
}

// tick notes that bytes arrived: the idle timer starts again.
func (a *attempt) tick() {
	if a.phase != nil {
		if d := time.Duration(a.idle.Load()); d > 0 {
			a.phase.Reset(d)
		}
	}
}

// stop ends the attempt: timers stopped, watch ended, context cancelled.
func (a *attempt) stop() {
	a.mu.Lock()
	a.stopped = true
	if a.unwatch != nil {
		a.unwatch()
	}
	a.mu.Unlock()
	if a.phase != nil {
		a.phase.Stop()
	}
	if a.total != nil {
		a.total.Stop()
	}
	a.endSpan()
	a.cancel(context.Canceled)
}

// fault turns an attempt's error into what the router reports: a timeout
// that fired (also when the transport saw only a cancelled context), or
// err as it is; the request context's error when the client went away.
func (a *attempt) fault(err error) error {
	if perr := a.parent.Err(); perr != nil {
		return perr
	}
	var te *timeoutError
	if errors.As(context.Cause(a.ctx), &te) {
		return &upstreamError{code: codeUpstreamTimeout, kind: te.kind, err: te}
	}
	if isDialError(err) {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return &upstreamError{code: codeUpstreamTimeout, kind: timeoutConnect, err: err}
		}
	}
	return err
}

// isDialError reports whether err is a failure to connect.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// timeoutKind returns the timeout kind of err, or "".
func timeoutKind(err error) string {
	var ue *upstreamError
	if errors.As(err, &ue) {
		return ue.kind
	}
	return ""
}

// body wraps an upstream body so that reads keep the idle timer going
// and Close ends the attempt.
type body struct {
	rc io.ReadCloser
	a  *attempt
}

// Read implements io.Reader.
func (b *body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if n > 0 {
		b.a.tick()
	}
	return n, err
}

// Close implements io.Closer.
func (b *body) Close() error {
	err := b.rc.Close()
	b.a.stop()
	return err
}

// buffered is a non-streaming response read ahead (all of it, or up to
// the retry buffer's size) and then the rest of its body.
type buffered struct {
	head []byte
	rest io.ReadCloser // nil once the whole body was read
}

// Read implements io.Reader.
func (b *buffered) Read(p []byte) (int, error) {
	if len(b.head) > 0 {
		n := copy(p, b.head)
		b.head = b.head[n:]
		return n, nil
	}
	if b.rest == nil {
		return 0, io.EOF
	}
	return b.rest.Read(p)
}

// Close implements io.Closer.
func (b *buffered) Close() error {
	if b.rest != nil {
		return b.rest.Close()
	}
	return nil
}

// readWhole reads resp's body up to limit bytes into buf (returned, grown
// as needed), so that a failure while reading it can still be retried. A
// body larger than limit is read no further: its head and the rest pass
// through. The attempt ends with the body, or here when all of it was
// read.
func readWhole(resp *http.Response, a *attempt, limit int64, buf []byte) ([]byte, error) {
	rc := &body{rc: resp.Body, a: a}
	head, err := readGrowing(io.LimitReader(rc, limit+1), buf, min(resp.ContentLength, limit))
	if err != nil {
		rc.Close()
		return head, a.fault(err)
	}
	b := &buffered{head: head, rest: rc}
	a.answered.Store(true)
	if int64(len(head)) <= limit {
		rc.Close()
		b.rest = nil
	}
	resp.Body = b
	return head, nil
}

// timeoutResponse is the OpenAI-shaped 504 the router answers when the
// last replica tried timed out before anything reached the client.
func timeoutResponse(req *http.Request, err error) *http.Response {
	return upstreamResponse(req, http.StatusGatewayTimeout, codeUpstreamTimeout, "no replica answered in time: "+err.Error())
}

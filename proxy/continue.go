package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"

	"github.com/kvrouter/kvrouter/sse"
)

// maxPendingEvent caps the bytes of one SSE event the router holds while
// waiting for its end; a replica sending more without a blank line has
// failed.
const maxPendingEvent = 4 << 20

// Midstream results, the values of kvrouter_stream_failures_total's
// result label.
const (
	midContinued = "continued"
	midError     = "error"
)

// stream is the body of a routed SSE response. It reads ahead to the
// first content event before the router commits to the replica
// (readAhead, inside the retrier's RoundTrip), and afterwards, when the
// replica fails (a read error, an end before [DONE] or a finish_reason,
// the stream-idle timeout), continues the generation on another replica:
// the conversation plus the partial reply with continue_final_message for
// chat, the prompt plus the generated text for completions, max_tokens
// reduced by the tokens already sent. The continuation's events reach the
// client as if the first replica had sent them: same chunk id and
// created, its role chunk dropped, its usage net of what the first
// replica generated. When no continuation is possible, Read returns an
// *upstreamError, which the tap turns into a final SSE error event.
//
// Only the request's goroutine uses a stream; its timers only cancel the
// attempt's context.
type stream struct {
	c     *call
	first *http.Request // the request as first sent
	orig  []byte        // its body, once read for a continuation
	req   *http.Request // the request sent to the current replica
	a     *attempt
	rc    io.ReadCloser // the current replica's body

	in  []byte // bytes read and not yet framed into events
	off int    // sp.Out[:off] went to the client
	err error  // terminal: io.EOF, or the failure handed to the tap

	sp        sse.Splice // the events, as the client must see them
	continued int        // continuations so far
}

// newStream wraps the body of resp, the answer to req within a, in the
// call's stream.
func newStream(c *call, req *http.Request, a *attempt, rc io.ReadCloser) *stream {
	s := &c.st
	s.reset()
	s.c, s.first, s.req, s.a, s.rc = c, req, req, a, rc
	s.sp.Chat = c.path == "/v1/chat/completions"
	// The tap is shown each event as it joins the splice's output, so
	// that it reads the stream in the same pass (sse.Tap.Framed); it
	// forgets what an earlier attempt showed it.
	c.tap.Reset(keepBytes)
	c.tap.Strip, s.sp.Tap = c.strip, &c.tap
	if !replayable(req) {
		s.sp.Stuck = "the request body cannot be replayed"
	}
	return s
}

// reset empties s for another request, keeping its events' buffers.
func (s *stream) reset() {
	sp := s.sp
	sp.Reset(keepBytes)
	*s = stream{sp: sp}
}

// readAhead reads until the attempt's first content event (or its end),
// which commits the call to this replica, and then moves the attempt to
// the stream-idle timeout. An error means nothing may reach the client:
// the call is retried elsewhere.
func (s *stream) readAhead() error {
	for !s.sp.Committed {
		if err := s.fill(); err != nil && err != io.EOF {
			return err
		}
	}
	s.a.streaming()
	return nil
}

// Read implements io.Reader.
func (s *stream) Read(p []byte) (int, error) {
	for s.off == len(s.sp.Out) {
		s.sp.Out, s.off = s.sp.Out[:0], 0
		if s.err != nil {
			return 0, s.err
		}
		switch err := s.fill(); {
		case err == io.EOF:
			s.err = io.EOF
		case err != nil:
			s.err = s.failover(err)
		}
	}
	n := copy(p, s.sp.Out[s.off:])
	s.off += n
	return n, nil
}

// Close implements io.Closer.
func (s *stream) Close() error {
	err := s.rc.Close()
	s.a.stop()
	s.c.rt.readBufs.put(s.in)
	s.in = nil
	return err
}

// readBufs pools the buffers streams read their replica's bytes into
// (stream.in): one per streamed request otherwise.
type readBufs struct{ p sync.Pool }

// readBufSize is a pooled buffer's capacity; larger ones (a stream that
// met a long event) are dropped.
const readBufSize = 8 << 10

func (b *readBufs) get() []byte {
	if a, ok := b.p.Get().(*[readBufSize]byte); ok {
		return a[:0]
	}
	return make([]byte, 0, readBufSize)
}

func (b *readBufs) put(buf []byte) {
	if cap(buf) == readBufSize {
		b.p.Put((*[readBufSize]byte)(buf[:readBufSize]))
	}
}

// fill reads once from the replica and frames what it can. It returns
// io.EOF at the end of a stream that delivered its end, and the failure of
// one that did not (or of an error event before the first token).
func (s *stream) fill() error {
	if s.in == nil {
		s.in = s.c.rt.readBufs.get()
	}
	if cap(s.in)-len(s.in) < 4096 {
		s.in = slices.Grow(s.in, cap(s.in)+8192)
	}
	n, err := s.rc.Read(s.in[len(s.in):cap(s.in)])
	if n > 0 {
		s.a.tick()
		s.in = s.sp.Frame(s.in[:len(s.in)+n])
	}
	switch {
	case s.sp.Failed:
		return &upstreamError{code: codeStreamCut, err: fmt.Errorf("the replica sent an error event: %s", s.sp.FailMessage)}
	case len(s.in) > maxPendingEvent:
		return s.a.fault(fmt.Errorf("the replica sent an SSE event larger than %d bytes", maxPendingEvent))
	case err == nil:
		return nil
	case s.sp.Ended:
		s.sp.Out = append(s.sp.Out, s.in...) // a trailing partial event passes through
		s.in = s.in[:0]
		return io.EOF
	case err == io.EOF:
		err = errors.New("the replica ended the stream before it finished")
	}
	return s.a.fault(err)
}

// failover continues the stream on another replica after cause ended the
// current one's, and returns nil once a continuation delivered its first
// token; otherwise the error the client's final event reports.
func (s *stream) failover(cause error) error {
	c, rt := s.c, s.c.rt
	if kind := timeoutKind(cause); kind != "" {
		rt.m.timeouts.WithLabelValues(kind).Inc()
	}
	if s.a.parent.Err() != nil {
		return cause // the client went away
	}
	s.Close()
	sent := s.sp.Tokens
	why := s.sp.Stuck
	switch {
	case timeoutKind(cause) == timeoutTotal:
		why = "the request is out of time"
	case !rt.cfg.StreamContinue:
		why = "continuation is off (--stream-continue=false)"
	}
	var body []byte
	if why == "" {
		var err error
		if body, err = s.continuation(); err != nil {
			why = err.Error()
		}
	}
	for why == "" && s.continued < rt.cfg.Retries {
		s.continued++
		failed := c.replica
		c.abandon(cause, errUpstreamFailed)
		if !c.repick() {
			why = "no other replica can take it"
			break
		}
		err := s.open(body)
		if err == nil {
			rt.m.midstream.WithLabelValues(midContinued).Inc()
			rt.log.Info("stream continued on another replica", "id", c.id, "failed", rt.name(failed),
				"replica", rt.name(c.replica), "tokens_before", sent, "err", cause)
			return nil
		}
		cause = err
		if s.a.parent.Err() != nil {
			return cause
		}
	}
	if why == "" {
		why = fmt.Sprintf("no continuation succeeded in %d tries", s.continued)
	}
	rt.m.midstream.WithLabelValues(midError).Inc()
	rt.log.Warn("stream failed after its first token", "id", c.id, "replica", rt.name(c.replica), "tokens", sent, "err", cause, "not_continued", why)
	code := codeStreamCut
	if timeoutKind(cause) != "" {
		code = codeUpstreamTimeout
	}
	return &upstreamError{code: code, kind: timeoutKind(cause), err: fmt.Errorf("%w; not continued: %s", cause, why)}
}

// open sends a continuation body to the call's replica and reads ahead to
// its first token. On success the stream reads from it from then on.
func (s *stream) open(body []byte) error {
	c, rt := s.c, s.c.rt
	next := s.req.Clone(s.a.parent)
	u := *rt.url(c.replica)
	u.Path, u.RawPath, u.RawQuery = s.req.URL.Path, s.req.URL.RawPath, s.req.URL.RawQuery
	next.URL, next.Host = &u, ""
	next.Body = io.NopCloser(bytes.NewReader(body))
	next.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	next.ContentLength = int64(len(body))
	next.Header.Set("Content-Length", strconv.Itoa(len(body)))
	a := c.newAttempt(s.a.parent, rt.cfg.TTFTTimeout)
	resp, err := rt.upstream.RoundTrip(next.WithContext(a.ctx))
	if err != nil {
		a.stop()
		return a.fault(err)
	}
	if resp.StatusCode != http.StatusOK || !isSSE(resp) {
		drain(resp)
		a.stop()
		return fmt.Errorf("continuation answered %s", resp.Status)
	}
	s.req, s.a, s.rc = next, a, resp.Body
	s.in = s.in[:0]
	s.sp.Continue()
	if err := s.readAhead(); err != nil {
		s.Close()
		return err
	}
	c.ticket.FirstToken(rt.now())
	return nil
}

// continuation returns the body asking for the rest of the reply: the
// call's original body (as first sent) with the text generated so far.
func (s *stream) continuation() ([]byte, error) {
	if s.orig == nil {
		s.orig = s.c.untransferred() // without the KV transfer's params; nil: none
	}
	if s.orig == nil {
		if s.first.GetBody == nil {
			return nil, errors.New("the request body cannot be replayed")
		}
		rc, err := s.first.GetBody()
		if err != nil {
			return nil, err
		}
		s.orig, err = io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return nil, err
		}
	}
	return sse.ContinueBody(s.orig, s.sp.Chat, string(s.sp.Text), s.sp.Tokens)
}

// isSSE reports whether resp is an event stream.
func isSSE(resp *http.Response) bool {
	ct := resp.Header.Get("Content-Type")
	return len(ct) >= 17 && ct[:17] == "text/event-stream"
}

// drain reads a little of an unwanted response, so that its connection
// can be reused, and closes it.
func drain(resp *http.Response) {
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}

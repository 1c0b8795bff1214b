package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
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
	out []byte // events ready for the client, from off
	off int
	err error // terminal: io.EOF, or the failure handed to the tap

	ch chunk // the event being read, reused

	committed bool   // the current attempt delivered a content event or its end
	ended     bool   // the stream delivered its end
	errEvent  error  // an error event before the first token
	stuck     string // why the stream cannot be continued; "" if it can

	// What the client saw of the first replica, which continuations keep.
	id      string
	created []byte // the JSON number
	text    []byte // choice 0's text so far
	tokens  int    // content events so far

	// The current continuation, if any: its own chunk id and created,
	// replaced by the first replica's, and tokens when it started.
	cont        bool
	contID      string
	contCreated []byte
	before      int
	continued   int // continuations so far
}

// newStream wraps the body of resp, the answer to req within a.
func newStream(c *call, req *http.Request, a *attempt, rc io.ReadCloser) *stream {
	s := &stream{c: c, first: req, req: req, a: a, rc: rc}
	if !replayable(req) {
		s.stuck = "the request body cannot be replayed"
	}
	return s
}

// readAhead reads until the attempt's first content event (or its end),
// which commits the call to this replica, and then moves the attempt to
// the stream-idle timeout. An error means nothing may reach the client:
// the call is retried elsewhere.
func (s *stream) readAhead() error {
	for !s.committed {
		if err := s.fill(); err != nil && err != io.EOF {
			return err
		}
	}
	s.a.streaming()
	return nil
}

// Read implements io.Reader.
func (s *stream) Read(p []byte) (int, error) {
	for s.off == len(s.out) {
		s.out, s.off = s.out[:0], 0
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
	n := copy(p, s.out[s.off:])
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
		s.in = s.in[:len(s.in)+n]
		s.frame()
	}
	switch {
	case s.errEvent != nil:
		return s.errEvent
	case len(s.in) > maxPendingEvent:
		return s.a.fault(fmt.Errorf("the replica sent an SSE event larger than %d bytes", maxPendingEvent))
	case err == nil:
		return nil
	case s.ended:
		s.out = append(s.out, s.in...) // a trailing partial event passes through
		s.in = s.in[:0]
		return io.EOF
	case err == io.EOF:
		err = errors.New("the replica ended the stream before it finished")
	}
	return s.a.fault(err)
}

// frame hands each whole event of in to event and keeps the rest.
func (s *stream) frame() {
	done := 0
	for {
		i := nextEventEnd(s.in[done:])
		if i < 0 {
			break
		}
		s.event(s.in[done : done+i])
		done += i
	}
	s.in = s.in[:copy(s.in, s.in[done:])]
}

// chunk is as much of a completion chunk as a stream reads, in a shape
// that decodes with few allocations (it is read for every event).
type chunk struct {
	Choices []choice        `json:"choices"`
	Usage   nonNull         `json:"usage"`
	Error   json.RawMessage `json:"error"`
}

type choice struct {
	Index int    `json:"index"`
	Text  string `json:"text"`
	Delta struct {
		Content   string  `json:"content"`
		Reasoning string  `json:"reasoning_content"`
		ToolCalls nonNull `json:"tool_calls"`
	} `json:"delta"`
	FinishReason nonNull `json:"finish_reason"`
}

// chunkIDs are a chunk's id and created, read until known.
type chunkIDs struct {
	ID      string          `json:"id"`
	Created json.RawMessage `json:"created"`
}

// nonNull notes whether a JSON value is there and not null (or an empty
// array) without keeping it.
type nonNull bool

// UnmarshalJSON implements json.Unmarshaler.
func (n *nonNull) UnmarshalJSON(b []byte) error {
	*n = nonNull(string(b) != "null" && string(b) != "[]")
	return nil
}

// event reads one event and passes it on, as the client must see it.
func (s *stream) event(ev []byte) {
	data := sseData(ev)
	switch {
	case bytes.Equal(data, doneData):
		s.committed, s.ended = true, true
		s.emit(ev)
		return
	case len(data) == 0 || data[0] != '{': // a comment, a keep-alive
		if s.committed || !s.cont {
			s.out = append(s.out, ev...)
		}
		return
	case s.committed && s.stuck != "": // nothing more to learn from it
		s.ended = s.ended || finished(ev)
		s.emit(ev)
		return
	case s.committed && !s.cont:
		s.scan(ev, data)
		return
	}
	ch := &s.ch
	ch.Choices, ch.Usage, ch.Error = ch.Choices[:0], false, nil
	if err := json.Unmarshal(data, ch); err != nil {
		s.stuck = "an event is not JSON"
		s.emit(ev)
		return
	}
	if len(ch.Error) > 0 && string(ch.Error) != "null" {
		s.errorEvent(ev, ch.Error)
		return
	}
	content := s.choices(ch)
	s.learnIDs(data)
	if !s.committed && !content && !s.ended {
		if !s.cont {
			s.out = append(s.out, ev...)
		}
		return // a continuation's role chunk: the client has one
	}
	s.committed = true
	if s.cont && len(ch.Choices) == 0 && bool(ch.Usage) {
		s.emitUsage(data)
		return
	}
	s.emit(ev)
}

// scan reads a committed event of the first replica without decoding it
// whole: its text, whether it ends the stream, whether it makes the stream
// impossible to continue (reasoning, tool calls). vLLM sends one such
// event per token.
func (s *stream) scan(ev, data []byte) {
	switch {
	case bytes.HasPrefix(data, errorKey):
		s.ended = true
	case hasValue(data, reasoningKey) || hasValue(data, reasonKey):
		s.stuck = "the reply has reasoning content"
	case hasValue(data, toolCallsKey):
		s.stuck = "the reply has tool calls"
	}
	key := textKey
	if s.c.path == "/v1/chat/completions" {
		key = contentKey
	}
	n := len(s.text)
	text, ok := stringField(s.text, data, key)
	if !ok && bytes.Contains(data, key) && !bytes.Contains(data, emptyChoices) {
		s.stuck = "an event could not be read"
	}
	if s.text = text; len(text) > n {
		s.tokens++
	}
	s.ended = s.ended || finished(ev)
	s.emit(ev)
}

// choices notes what the event's choices carry and reports whether it
// has content (text, a tool call, reasoning) or an end.
func (s *stream) choices(ch *chunk) bool {
	content := false
	for i := range ch.Choices {
		c := &ch.Choices[i]
		if c.Index != 0 {
			s.stuck = "the request asks for several choices"
		}
		if bool(c.FinishReason) {
			s.ended, content = true, true
		}
		if c.Delta.Reasoning != "" {
			s.stuck, content = "the reply has reasoning content", true
		}
		if bool(c.Delta.ToolCalls) {
			s.stuck, content = "the reply has tool calls", true
		}
		if text := c.Text + c.Delta.Content; text != "" {
			content = true
			s.text = append(s.text, text...)
			s.tokens++
		}
	}
	return content
}

// learnIDs keeps the first replica's chunk id and created, and a
// continuation's own, from the first event that has them.
func (s *stream) learnIDs(data []byte) {
	if (!s.cont && s.id != "") || (s.cont && s.contID != "") {
		return
	}
	var ids chunkIDs
	if json.Unmarshal(data, &ids) != nil || ids.ID == "" {
		return
	}
	if s.cont {
		s.contID, s.contCreated = ids.ID, ids.Created
	} else {
		s.id, s.created = ids.ID, ids.Created
	}
}

// errorEvent handles an engine's error event: before the first token the
// attempt failed (and is retried); after it the event ends the stream.
func (s *stream) errorEvent(ev, e []byte) {
	if !s.committed {
		var ae struct {
			Message string `json:"message"`
		}
		json.Unmarshal(e, &ae)
		s.errEvent = &upstreamError{code: codeStreamCut, err: fmt.Errorf("the replica sent an error event: %s", ae.Message)}
		return
	}
	s.ended = true
	s.emit(ev)
}

// emit appends ev to out, a continuation's with the first replica's
// chunk id and created in place of its own.
func (s *stream) emit(ev []byte) {
	if !s.cont {
		s.out = append(s.out, ev...)
		return
	}
	if s.contID != "" && s.contID != s.id {
		ev = replaceOnce(&s.out, ev, strconv.AppendQuote(nil, s.contID), strconv.AppendQuote(nil, s.id))
	}
	if len(s.contCreated) > 0 && !bytes.Equal(s.contCreated, s.created) {
		ev = replaceOnce(&s.out, ev, append([]byte(`"created":`), s.contCreated...), append([]byte(`"created":`), s.created...))
	}
	s.out = append(s.out, ev...)
}

// replaceOnce appends to *out ev up to and including new in place of the
// first old, and returns the rest of ev; all of ev when old is absent.
func replaceOnce(out *[]byte, ev, old, new []byte) []byte {
	i := bytes.Index(ev, old)
	if i < 0 {
		return ev
	}
	*out = append(append(*out, ev[:i]...), new...)
	return ev[i+len(old):]
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
	sent := s.tokens
	why := s.stuck
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
	s.in, s.cont, s.committed, s.errEvent = s.in[:0], true, false, nil
	s.contID, s.contCreated, s.before = "", nil, s.tokens
	if err := s.readAhead(); err != nil {
		s.Close()
		return err
	}
	c.ticket.FirstToken(rt.now())
	return nil
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

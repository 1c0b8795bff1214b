package sse

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"time"
)

// Usage is the OpenAI usage object, as much of it as the router reads.
type Usage struct {
	PromptTokens        int  `json:"prompt_tokens"`
	CompletionTokens    *int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// Cached returns usage.prompt_tokens_details.cached_tokens, or -1 when the
// engine did not report it.
func (u *Usage) Cached() int {
	if u.PromptTokensDetails == nil {
		return -1
	}
	return u.PromptTokensDetails.CachedTokens
}

// Completion returns usage.completion_tokens, or -1 when the engine did
// not report it.
func (u *Usage) Completion() int {
	if u.CompletionTokens == nil {
		return -1
	}
	return *u.CompletionTokens
}

// usageBody is a chunk or a whole non-streaming response: the tap reads
// its usage, whether it has choices, and the response's model and id.
type usageBody struct {
	Choices elements `json:"choices"`
	Usage   *Usage   `json:"usage"`
	Model   string   `json:"model"`
	ID      string   `json:"id"`
}

// elements notes whether a JSON array has elements, without keeping
// them; null is an empty array, any other value an error.
type elements bool

// UnmarshalJSON implements json.Unmarshaler.
func (e *elements) UnmarshalJSON(b []byte) error {
	switch {
	case string(b) == "null":
		*e = false
	case len(b) > 0 && b[0] == '[':
		rest := bytes.TrimLeft(b[1:], " \t\r\n")
		*e = len(rest) > 0 && rest[0] != ']'
	default:
		return errNotArray
	}
	return nil
}

// errNotArray is a "choices" member that is not an array.
var errNotArray = errors.New("choices is not an array")

// maxJSONCopy caps the bytes of a non-streaming response kept to read its
// usage at the end.
const maxJSONCopy = 1 << 20

// CodeStreamCut is the error code of the event that ends a stream the
// upstream cut, unless its read error says another (Tap).
const CodeStreamCut = "upstream_stream_cut"

// Tap wraps an upstream response body. It hands the client the same bytes
// the upstream sent, with one exception: when Strip is set, because the
// router asked for usage and the client did not, an SSE event that carries
// only usage (no choices) is dropped, and the "usage": null member that
// engines then add to every other chunk is cut from it. It records when
// the first byte arrived, the usage, and any upstream read error. SSE is
// handed out one whole event at a time, so ReverseProxy's per-write flush
// is a per-event flush.
//
// Set the fields above the line before the first Read; the ones below
// are what the Tap found. Reset empties it for the next body, keeping
// its buffers.
type Tap struct {
	// Body is the upstream body.
	Body io.ReadCloser
	// SSE is set for an event stream; false reads a JSON body.
	SSE bool
	// Strip drops the usage-only event and "usage": null members.
	Strip bool
	// OnFirst, if set, is told once the time of the first byte.
	OnFirst func(at time.Time)
	// OnToken, if set, is told the time of each SSE event after the first
	// that carries output (a delta's content, text, reasoning or tool
	// call): one token each, as vLLM and SGLang stream by default.
	OnToken func(at time.Time)
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Framed is set when Body hands out whole events that this Tap has
	// already been shown (a Splice's Out, with Splice.Tap set to it):
	// Read then passes Body's bytes on as they come, without framing or
	// reading them again. A Framed Tap's Strip must be set before the
	// Splice's first event.
	Framed bool

	// First is when the first byte arrived; zero before.
	First time.Time
	// Usage is the body's usage, if HasUsage.
	Usage    Usage
	HasUsage bool
	// Model and ResponseID are the "model" and "id" of the response (the
	// chunk that carried the usage, or the whole JSON body), if HasUsage.
	Model, ResponseID string
	// Stripped is set once a usage-only event was dropped.
	Stripped bool
	// Err is the upstream read error other than io.EOF.
	Err error
	// Ended is true once an SSE stream delivered its end: a [DONE] event
	// or a chunk with a finish_reason. Cut is true when the upstream ended
	// an SSE stream before that (EOF or a read error, kept in Err): the
	// client then gets a final OpenAI-shaped error event instead of a
	// silent end, whose code is CutCode.
	Ended, Cut bool
	CutCode    string
	// ErrEvent is true once an SSE stream delivered an error event (data
	// {"error": ...}): an end, but not a good one.
	ErrEvent bool
	// Outputs counts the SSE events that carried output.
	Outputs int

	eof   bool
	given bool   // JSON: the caller read the usage (SetUsage)
	buf   []byte // SSE: bytes read and not yet handed out
	ready int    // SSE: buf[:ready] are whole events ready to hand out
	copy  []byte // JSON: copy of the body for usage at EOF
}

// Reset empties t for another body, keeping its buffers' capacity up to
// keep bytes (a larger one is dropped).
func (t *Tap) Reset(keep int) {
	*t = Tap{buf: trim(t.buf, keep), copy: trim(t.copy, keep)}
}

// trim returns b emptied, or nil if its capacity is over keep.
func trim(b []byte, keep int) []byte {
	if cap(b) > keep {
		return nil
	}
	return b[:0]
}

// Read implements io.Reader.
func (t *Tap) Read(p []byte) (int, error) {
	if !t.SSE {
		return t.readJSON(p)
	}
	if t.Framed && !t.eof {
		return t.readFramed(p)
	}
	for t.ready == 0 {
		if t.eof {
			if len(t.buf) == 0 {
				return 0, io.EOF
			}
			t.ready = len(t.buf) // a trailing partial event passes through
			break
		}
		t.fill()
	}
	n := copy(p, t.buf[:t.ready])
	t.buf = t.buf[:copy(t.buf, t.buf[n:])]
	t.ready -= n
	return n, nil
}

// readFramed passes on what Body hands out, whole events already shown
// to the Tap; at the end of a stream that did not deliver its end, Read
// hands out the error event cutStream appends.
func (t *Tap) readFramed(p []byte) (int, error) {
	n, err := t.Body.Read(p)
	if n > 0 {
		t.firstByte()
	}
	if err != nil {
		t.end(err)
	}
	if n > 0 || err == nil {
		return n, nil
	}
	return t.Read(p)
}

// end notes the error that ended an SSE Body: EOF, or a read error kept
// in Err. A stream that did not deliver its end is cut.
func (t *Tap) end(err error) {
	if err != io.EOF {
		t.Err = err
	}
	t.eof = true
	if !t.Ended {
		t.cutStream()
	}
}

// fill reads once from the upstream and frames what it can into events.
func (t *Tap) fill() {
	if cap(t.buf)-len(t.buf) < 4096 {
		nb := make([]byte, len(t.buf), 2*cap(t.buf)+8192)
		copy(nb, t.buf)
		t.buf = nb
	}
	n, err := t.Body.Read(t.buf[len(t.buf):cap(t.buf)])
	if n > 0 {
		t.firstByte()
		start := len(t.buf)
		t.buf = t.buf[:start+n]
		t.frame(start)
	}
	if err != nil {
		t.end(err)
	}
}

// coded is a read error that names the code of the event that ends the
// stream (the router's reason: a timeout, a failed continuation).
type coded interface {
	error
	Code() string
}

// cutStream ends a stream the upstream cut: whatever partial event was
// left is closed, and an error event follows as the stream's last. Its
// code is the read error's when it has a Code method, else
// CodeStreamCut.
func (t *Tap) cutStream() {
	t.Cut, t.CutCode = true, CodeStreamCut
	why := "the replica ended the stream before it finished"
	var c coded
	switch {
	case errors.As(t.Err, &c):
		why, t.CutCode = "the stream failed: "+c.Error(), c.Code()
	case t.Err != nil:
		why += ": " + t.Err.Error()
	}
	if len(t.buf) > t.ready { // close the partial event left
		t.buf = append(t.buf, EventEnd...)
	}
	t.buf = AppendError(t.buf, "upstream_error", t.CutCode, why)
	t.ready = len(t.buf)
}

// AppendError appends the event of an OpenAI error object: data
// {"error": {"message", "type", "param": null, "code"}}.
func AppendError(dst []byte, typ, code, msg string) []byte {
	dst = append(dst, `data: {"error":{"message":`...)
	dst = appendString(dst, msg)
	dst = append(dst, `,"type":`...)
	dst = appendString(dst, typ)
	dst = append(dst, `,"param":null,"code":`...)
	dst = appendString(dst, code)
	return append(dst, "}}\n\n"...)
}

// appendString appends s as a JSON string, as encoding/json writes it.
func appendString(dst []byte, s string) []byte {
	b, _ := json.Marshal(s)
	return append(dst, b...)
}

// frame moves whole events of buf past ready into the ready region, as
// pass leaves them. from is where new bytes start.
func (t *Tap) frame(from int) {
	at := max(t.ready, from-2)
	for {
		i := NextEventEnd(t.buf[at:])
		if i < 0 {
			return
		}
		end := at + i
		ev := t.buf[t.ready:end]
		f := scan(ev)
		if n := t.pass(ev, &f); n < len(ev) {
			t.buf = append(t.buf[:t.ready+n], t.buf[end:]...)
			end = t.ready + n
		}
		t.ready, at = end, end
	}
}

// pass observes one whole event the client is to get, ev, whose facts
// are f, and returns how many of its leading bytes the client gets: all
// of them, fewer when stripping cut its "usage": null member (the bytes
// after it moved up), none when stripping dropped it (usage only).
func (t *Tap) pass(ev []byte, f *facts) int {
	if t.observe(ev, f) && t.Strip {
		t.Stripped = true
		return 0
	}
	if t.Strip {
		if a, b := nullUsage(ev, f.de); a < b {
			return a + copy(ev[a:], ev[b:])
		}
	}
	return len(ev)
}

// observe notes whether an event ends the stream, reads the usage of one
// that carries it and reports whether the event is usage only (no
// choices). It reads the event's facts, found in one pass (scan),
// and decodes only one that has "prompt_tokens": engines send the usage
// in the last chunks (the usage-only chunk after the finish, or the
// finish chunk), so the other chunks are scanned, never decoded.
func (t *Tap) observe(ev []byte, f *facts) bool {
	data := ev[f.ds:f.de]
	if !t.Ended && (bytes.Equal(data, doneData) || f.finished) {
		t.Ended = true
	}
	if !t.Ended && bytes.HasPrefix(data, errorKey) {
		t.Ended, t.ErrEvent = true, true
	}
	if f.hasContent || f.hasText || f.reasoning || f.toolCalls {
		t.Outputs++
		if t.Outputs > 1 && t.OnToken != nil {
			t.OnToken(t.now())
		}
	}
	if !f.usage {
		return false
	}
	var b usageBody
	if json.Unmarshal(data, &b) != nil || b.Usage == nil {
		return false
	}
	t.Usage, t.HasUsage, t.Model, t.ResponseID = *b.Usage, true, b.Model, b.ID
	return !bool(b.Choices)
}

// SetUsage gives the usage of a JSON body (u nil: it has none) and its
// model and id, which the caller read from the whole body before the Tap
// reads it: Read then keeps no copy of the body to read them at its end.
func (t *Tap) SetUsage(u *Usage, model, id string) {
	t.given = true
	if u != nil {
		t.Usage, t.HasUsage, t.Model, t.ResponseID = *u, true, model, id
	}
}

func (t *Tap) readJSON(p []byte) (int, error) {
	n, err := t.Body.Read(p)
	if n > 0 {
		t.firstByte()
		if !t.given && len(t.copy)+n <= maxJSONCopy {
			t.copy = append(t.copy, p[:n]...)
		}
	}
	switch {
	case err == io.EOF && t.given:
		t.eof = true
	case err == io.EOF:
		t.eof = true
		var b usageBody
		if json.Unmarshal(t.copy, &b) == nil && b.Usage != nil {
			t.Usage, t.HasUsage, t.Model, t.ResponseID = *b.Usage, true, b.Model, b.ID
		}
	case err != nil:
		t.Err = err
	}
	return n, err
}

func (t *Tap) firstByte() {
	if !t.First.IsZero() {
		return
	}
	t.First = t.now()
	if t.OnFirst != nil {
		t.OnFirst(t.First)
	}
}

// now is the Tap's clock's time.
func (t *Tap) now() time.Time {
	if t.Now != nil {
		return t.Now()
	}
	return time.Now()
}

// Close closes the upstream body.
func (t *Tap) Close() error { return t.Body.Close() }

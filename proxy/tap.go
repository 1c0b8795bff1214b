package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"time"
)

// usage is the OpenAI usage object, as much of it as the router reads.
type usage struct {
	PromptTokens        int  `json:"prompt_tokens"`
	CompletionTokens    *int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// cached returns usage.prompt_tokens_details.cached_tokens, or -1 when the
// engine did not report it.
func (u *usage) cached() int {
	if u.PromptTokensDetails == nil {
		return -1
	}
	return u.PromptTokensDetails.CachedTokens
}

// completion returns usage.completion_tokens, or -1 when the engine did
// not report it.
func (u *usage) completion() int {
	if u.CompletionTokens == nil {
		return -1
	}
	return *u.CompletionTokens
}

// usageBody is a chunk or a whole non-streaming response: the router reads
// its usage and whether it has choices.
type usageBody struct {
	Choices []json.RawMessage `json:"choices"`
	Usage   *usage            `json:"usage"`
}

// maxJSONCopy caps the bytes of a non-streaming response kept to read its
// usage at the end.
const maxJSONCopy = 1 << 20

// tap wraps an upstream response body. It hands the client the same bytes
// the upstream sent, with one exception: when strip is set, because the
// router asked for usage and the client did not, an SSE event that carries
// only usage (no choices) is dropped, and the "usage": null member that
// engines then add to every other chunk is cut from it. It records when the first byte arrived, the
// usage, and any upstream read error. SSE is handed out one whole event at a
// time, so ReverseProxy's per-write flush is a per-event flush.
type tap struct {
	body  io.ReadCloser
	sse   bool
	strip bool
	// onFirst, if set, is told once the time of the first byte.
	onFirst firstHook
	// now is the clock; nil means time.Now.
	now func() time.Time

	first    time.Time
	usage    usage
	hasUsage bool
	stripped bool
	err      error // upstream read error other than io.EOF
	eof      bool
	// ended is true once an SSE stream delivered its end: a [DONE] event or
	// a chunk with a finish_reason. cut is true when the upstream ended an
	// SSE stream before that (EOF or a read error, kept in err): the client
	// then gets a final OpenAI-shaped error event instead of a silent end.
	ended, cut bool
	// errEvent is true once an SSE stream delivered an error event (data
	// {"error": ...}): an end, but not a good one.
	errEvent bool
	// cutCode is the error code of the final event a cut stream got.
	cutCode string

	buf   []byte // SSE: bytes read and not yet handed out
	ready int    // SSE: buf[:ready] are whole events ready to hand out
	copy  []byte // JSON: copy of the body for usage at EOF
}

// Read implements io.Reader.
func (t *tap) Read(p []byte) (int, error) {
	if !t.sse {
		return t.readJSON(p)
	}
	for t.ready == 0 {
		if t.eof {
			if len(t.buf) == 0 {
				return 0, io.EOF
			}
			t.ready = len(t.buf) // a trailing partial event passes through
			break
		}
		if err := t.fill(); err != nil {
			return 0, err
		}
	}
	n := copy(p, t.buf[:t.ready])
	t.buf = t.buf[:copy(t.buf, t.buf[n:])]
	t.ready -= n
	return n, nil
}

// fill reads once from the upstream and frames what it can into events.
func (t *tap) fill() error {
	if cap(t.buf)-len(t.buf) < 4096 {
		nb := make([]byte, len(t.buf), 2*cap(t.buf)+8192)
		copy(nb, t.buf)
		t.buf = nb
	}
	n, err := t.body.Read(t.buf[len(t.buf):cap(t.buf)])
	if n > 0 {
		t.firstByte()
		start := len(t.buf)
		t.buf = t.buf[:start+n]
		t.frame(start)
	}
	if err == nil {
		return nil
	}
	if err != io.EOF {
		t.err = err
	}
	t.eof = true
	if !t.ended {
		t.cutStream()
	}
	return nil
}

// cutStream ends a stream the upstream cut: whatever partial event was
// left is closed, and an error event follows as the stream's last. Its
// code is the router's reason when the body says one (an *upstreamError:
// a timeout, a failed continuation), else upstream_stream_cut.
func (t *tap) cutStream() {
	t.cut, t.cutCode = true, codeStreamCut
	why := "the replica ended the stream before it finished"
	var ue *upstreamError
	switch {
	case errors.As(t.err, &ue):
		why, t.cutCode = "the stream failed: "+ue.Error(), ue.code
	case t.err != nil:
		why += ": " + t.err.Error()
	}
	if len(t.buf) > t.ready { // close the partial event left
		t.buf = append(t.buf, eventEnd...)
	}
	t.buf = append(t.buf, "data: "...)
	t.buf = appendStreamError(t.buf, t.cutCode, why)
	t.buf = append(t.buf, eventEnd...)
	t.ready = len(t.buf)
}

// appendStreamError appends the OpenAI error object of a cut stream.
func appendStreamError(dst []byte, code, msg string) []byte {
	var e apiError
	e.Error.Message, e.Error.Type, e.Error.Code = msg, errUpstream, code
	b, _ := json.Marshal(&e)
	return append(dst, b...)
}

var eventEnd = []byte("\n\n")

// nextEventEnd returns where the first event of b ends (just past its
// blank line: "\n\n", or "\n\r\n" for CRLF line ends), or -1.
func nextEventEnd(b []byte) int {
	i, j := bytes.Index(b, eventEnd), bytes.Index(b, []byte("\n\r\n"))
	switch {
	case i < 0 && j < 0:
		return -1
	case j < 0 || i >= 0 && i < j:
		return i + 2
	}
	return j + 3
}

// frame moves whole events of buf past ready into the ready region,
// dropping the usage-only one when stripping. from is where new bytes start.
func (t *tap) frame(from int) {
	scan := max(t.ready, from-2)
	for {
		i := nextEventEnd(t.buf[scan:])
		if i < 0 {
			return
		}
		end := scan + i
		ev := t.buf[t.ready:end]
		if t.observe(ev) && t.strip {
			t.buf = append(t.buf[:t.ready], t.buf[end:]...)
			t.stripped = true
			scan = t.ready
			continue
		}
		if t.strip {
			if a, b := nullUsage(ev); a < b {
				t.buf = append(t.buf[:t.ready+a], t.buf[t.ready+b:]...)
				end -= b - a
			}
		}
		t.ready = end
		scan = end
	}
}

var (
	promptTokensKey = []byte(`"prompt_tokens"`)
	errorKey        = []byte(`{"error"`)
	finishReasonKey = []byte(`"finish_reason"`)
	doneData        = []byte("[DONE]")
)

// observe notes whether an event ends the stream, reads the usage of one
// that carries it and reports whether the event is usage only (no
// choices).
func (t *tap) observe(ev []byte) bool {
	if !t.ended && (bytes.Equal(sseData(ev), doneData) || finished(ev)) {
		t.ended = true
	}
	if !t.ended && bytes.HasPrefix(sseData(ev), errorKey) {
		t.ended, t.errEvent = true, true
	}
	if !bytes.Contains(ev, promptTokensKey) {
		return false
	}
	data := sseData(ev)
	var b usageBody
	if json.Unmarshal(data, &b) != nil || b.Usage == nil {
		return false
	}
	t.usage, t.hasUsage = *b.Usage, true
	return len(b.Choices) == 0
}

// finished reports whether an event has a "finish_reason" that is not
// null (a string): a choice came to its end.
func finished(ev []byte) bool {
	for {
		i := bytes.Index(ev, finishReasonKey)
		if i < 0 {
			return false
		}
		ev = ev[i+len(finishReasonKey):]
		j := 0
		for j < len(ev) && (ev[j] == ' ' || ev[j] == ':' || ev[j] == '\t') {
			j++
		}
		if j < len(ev) && ev[j] == '"' {
			return true
		}
	}
}

// nullUsage finds, in an event whose first data line is a JSON object
// ending in a "usage": null member (where OpenAI and vLLM put it), the bytes
// to cut to remove that member with its comma: ev[a:b], or a == b when there
// is none. Only the object's last member is matched: quotes right before
// the final brace cannot be inside a string.
func nullUsage(ev []byte) (a, b int) {
	_, end := dataSpan(ev)
	if end == 0 || ev[end-1] != '}' {
		return 0, 0
	}
	b = skipSpaceBack(ev, end-1) // after the member's value
	i := b
	for _, tok := range [...]string{"null", ":", `"usage"`, ","} {
		i = skipSpaceBack(ev, i)
		if !bytes.HasSuffix(ev[:i], []byte(tok)) {
			return 0, 0
		}
		i -= len(tok)
	}
	return i, b
}

// skipSpaceBack returns i moved back over the JSON whitespace before it.
func skipSpaceBack(b []byte, i int) int {
	for i > 0 && (b[i-1] == ' ' || b[i-1] == '\t' || b[i-1] == '\n' || b[i-1] == '\r') {
		i--
	}
	return i
}

// sseData returns the payload of an event's first data line.
func sseData(ev []byte) []byte {
	start, end := dataSpan(ev)
	return ev[start:end]
}

// dataSpan returns where the payload of an event's first data line starts
// and ends in ev, spaces trimmed (0, 0 without one).
func dataSpan(ev []byte) (start, end int) {
	for off := 0; off < len(ev); {
		line, next := ev[off:], len(ev)
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			line, next = line[:i], off+i+1
		}
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			t := bytes.TrimLeft(d, " \t\r")
			start = off + len(line) - len(t)
			return start, start + len(bytes.TrimRight(t, " \t\r"))
		}
		off = next
	}
	return 0, 0
}

func (t *tap) readJSON(p []byte) (int, error) {
	n, err := t.body.Read(p)
	if n > 0 {
		t.firstByte()
		if len(t.copy)+n <= maxJSONCopy {
			t.copy = append(t.copy, p[:n]...)
		}
	}
	switch {
	case err == io.EOF:
		t.eof = true
		var b usageBody
		if json.Unmarshal(t.copy, &b) == nil && b.Usage != nil {
			t.usage, t.hasUsage = *b.Usage, true
		}
	case err != nil:
		t.err = err
	}
	return n, err
}

func (t *tap) firstByte() {
	if t.first.IsZero() {
		if t.now != nil {
			t.first = t.now()
		} else {
			t.first = time.Now()
		}
		if t.onFirst != nil {
			t.onFirst.firstByte(t.first)
		}
	}
}

// firstHook is what a tap tells of the first byte (the call).
type firstHook interface{ firstByte(at time.Time) }

// Close closes the upstream body.
func (t *tap) Close() error { return t.body.Close() }

package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"time"
)

// usage is the OpenAI usage object, as much of it as the router reads.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
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

	first    time.Time
	usage    usage
	hasUsage bool
	stripped bool
	err      error // upstream read error other than io.EOF
	eof      bool

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
	if err == io.EOF {
		t.eof = true
		return nil
	}
	if err != nil {
		t.err = err
		return err
	}
	return nil
}

var eventEnd = []byte("\n\n")

// frame moves whole events of buf past ready into the ready region,
// dropping the usage-only one when stripping. from is where new bytes start.
func (t *tap) frame(from int) {
	scan := max(t.ready, from-1)
	for {
		i := bytes.Index(t.buf[scan:], eventEnd)
		if i < 0 {
			return
		}
		end := scan + i + len(eventEnd)
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

var promptTokensKey = []byte(`"prompt_tokens"`)

// observe reads the usage of an event that carries one and reports whether
// the event is usage only (no choices).
func (t *tap) observe(ev []byte) bool {
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
		t.first = time.Now()
		if t.onFirst != nil {
			t.onFirst.firstByte(t.first)
		}
	}
}

// firstHook is what a tap tells of the first byte (the call).
type firstHook interface{ firstByte(at time.Time) }

// Close closes the upstream body.
func (t *tap) Close() error { return t.body.Close() }

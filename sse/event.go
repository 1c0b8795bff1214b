// Package sse reads and writes the server-sent event streams of OpenAI's
// streamed completions, as vLLM and SGLang send them: framing events,
// reading a few fields of each without decoding it whole (Tap, Splice),
// and the request body that continues a stream elsewhere
// (ContinueBody). It depends on the standard library only; its callers
// hook in with func fields, as httputil.ReverseProxy's do.
//
// Every byte comes from a replica and is untrusted: partial events,
// malformed JSON and oversized events are handled, never panicked on
// (the fuzz targets say so).
package sse

import "bytes"

// EventEnd is the blank line that ends an event.
var EventEnd = []byte("\n\n")

// doneData is the payload of the event that ends an OpenAI stream.
var doneData = []byte("[DONE]")

// Keys an event is scanned for without decoding it.
var (
	promptTokensKey = []byte(`"prompt_tokens"`)
	errorKey        = []byte(`{"error"`)
	finishReasonKey = []byte(`"finish_reason"`)
)

// NextEventEnd returns where the first event of b ends (just past its
// blank line: "\n\n", or "\n\r\n" for CRLF line ends), or -1. It reads b
// once, up to that end: each line end is looked at for a blank line after
// it.
func NextEventEnd(b []byte) int {
	for off := 0; ; off++ {
		i := bytes.IndexByte(b[off:], '\n')
		if i < 0 {
			return -1
		}
		off += i
		switch {
		case off+1 < len(b) && b[off+1] == '\n':
			return off + 2
		case off+2 < len(b) && b[off+1] == '\r' && b[off+2] == '\n':
			return off + 3
		}
	}
}

// Closed reports whether stream bytes ending in tail end an event.
func Closed(tail []byte) bool {
	return bytes.HasSuffix(tail, EventEnd) || bytes.HasSuffix(tail, []byte("\n\r\n"))
}

// Data returns the payload of an event's first data line, spaces
// trimmed.
func Data(ev []byte) []byte {
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
		if bytes.HasPrefix(line, []byte("data:")) {
			start, end = off+len("data:"), off+len(line)
			for start < end && isLineSpace(ev[start]) {
				start++
			}
			for end > start && isLineSpace(ev[end-1]) {
				end--
			}
			return start, end
		}
		off = next
	}
	return 0, 0
}

// isLineSpace reports whether c is trimmed from a data line's payload.
func isLineSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' }

// finished reports whether an event has a "finish_reason" that is not
// null (a string): a choice came to its end.
func finished(ev []byte) bool {
	for off := 0; ; {
		i := bytes.Index(ev[off:], finishReasonKey)
		if i < 0 {
			return false
		}
		off += i + len(finishReasonKey)
		if stringNext(ev, off) {
			return true
		}
	}
}

// stringNext reports whether a string starts at b[j] past spaces, tabs and
// colons: the value of a key that ends at j.
func stringNext(b []byte, j int) bool {
	for j < len(b) && (b[j] == ' ' || b[j] == ':' || b[j] == '\t') {
		j++
	}
	return j < len(b) && b[j] == '"'
}

// nullUsage finds, in an event whose first data line is a JSON object
// ending in a "usage": null member (where OpenAI and vLLM put it), the bytes
// to cut to remove that member with its comma: ev[a:b], or a == b when there
// is none. end is where the data line's payload ends (dataSpan). Only the
// object's last member is matched: quotes right before the final brace
// cannot be inside a string.
func nullUsage(ev []byte, end int) (a, b int) {
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

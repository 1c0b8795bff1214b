package sse

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// Splice reads the events of a chat or completions stream and writes to
// Out what the client must see, learning on the way what a continuation
// on another replica needs: the text so far, its token count, the chunk
// id and created, and whether the reply can be continued at all. After
// Continue, the events are a continuation's and reach Out as if the first
// replica had sent them: same chunk id and created, its role chunk
// dropped, its usage net of what the first replica generated.
//
// Set Chat before the first event; the caller empties Out as it hands
// its bytes on.
type Splice struct {
	// Chat is set for /v1/chat/completions, whose text is the delta's
	// content; otherwise a choice's text is.
	Chat bool
	// Out are the events ready for the client.
	Out []byte
	// Tap, if set, is shown each event as it joins Out (Tap.pass), which
	// may drop it or cut it when stripping: Out then holds what the
	// client gets, and a Framed Tap reading it need not read it again.
	Tap *Tap

	// Committed is set once the current replica delivered a content
	// event or its end: the client then has its bytes.
	Committed bool
	// Ended is set once the stream delivered its end.
	Ended bool
	// Failed is set by an engine's error event before the first token,
	// whose message is FailMessage; the event is not passed on.
	Failed      bool
	FailMessage string
	// Stuck says why the stream cannot be continued; "" if it can.
	Stuck string

	// What the client saw of the first replica, which continuations keep.
	ID      string
	Created []byte // the JSON number
	Text    []byte // choice 0's text so far
	Tokens  int    // content events so far

	// The current continuation, if any: its own chunk id and created,
	// replaced by the first replica's, and Tokens when it started.
	cont        bool
	contID      string
	contCreated []byte
	before      int

	ch chunk // the event being read, reused
	// f are the facts of the event being read when read, and scanned
	// says so: Tap is shown them when the event joins Out unchanged.
	f       facts
	scanned bool
}

// Reset empties s for another stream, keeping its buffers' capacity up to
// keep bytes.
func (s *Splice) Reset(keep int) {
	choices := s.ch.Choices[:cap(s.ch.Choices)]
	clear(choices) // decoding leaves the fields an event lacks as they were
	*s = Splice{Out: trim(s.Out, keep), Text: trim(s.Text, keep), ch: chunk{Choices: choices[:0]}}
}

// Continue starts a continuation: the events from now on are another
// replica's, which did not commit yet.
func (s *Splice) Continue() {
	s.cont, s.Committed, s.Failed, s.FailMessage = true, false, false, ""
	s.contID, s.contCreated, s.before = "", nil, s.Tokens
}

// Frame hands each whole event at the start of in to Event and returns
// in with them removed (the partial event left moved to its start).
func (s *Splice) Frame(in []byte) []byte {
	done := 0
	for {
		i := NextEventEnd(in[done:])
		if i < 0 {
			break
		}
		s.Event(in[done : done+i])
		done += i
	}
	return in[:copy(in, in[done:])]
}

// chunk is as much of a completion chunk as a Splice reads, in a shape
// that decodes with few allocations (it is read for every event).
type chunk struct {
	Choices []choice        `json:"choices"`
	Usage   nonNull         `json:"usage"`
	Error   json.RawMessage `json:"error"`
	// ID and Created are read until the stream's are known (learnIDs).
	ID      idString        `json:"id"`
	Created json.RawMessage `json:"created"`
}

// idString is a chunk's id: a JSON string, "" for any other value (which
// does not fail the event's decoding).
type idString string

// UnmarshalJSON implements json.Unmarshaler.
func (s *idString) UnmarshalJSON(b []byte) error {
	var v string
	if json.Unmarshal(b, &v) == nil {
		*s = idString(v)
	}
	return nil
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

// nonNull notes whether a JSON value is there and not null (or an empty
// array) without keeping it.
type nonNull bool

// UnmarshalJSON implements json.Unmarshaler.
func (n *nonNull) UnmarshalJSON(b []byte) error {
	*n = nonNull(string(b) != "null" && string(b) != "[]")
	return nil
}

// Event reads one event and passes it on, as the client must see it.
func (s *Splice) Event(ev []byte) {
	from := len(s.Out)
	s.scanned = false
	s.event(ev)
	if s.Tap == nil || len(s.Out) == from {
		return
	}
	out := s.Out[from:]
	if !s.scanned || len(out) != len(ev) {
		s.f = scan(out)
	}
	s.Out = s.Out[:from+s.Tap.pass(out, &s.f)]
}

// event reads one event and appends to Out what the client must see of
// it.
func (s *Splice) event(ev []byte) {
	data := Data(ev)
	switch {
	case bytes.Equal(data, doneData):
		s.Committed, s.Ended = true, true
		s.emit(ev)
		return
	case len(data) == 0 || data[0] != '{': // a comment, a keep-alive
		if s.Committed || !s.cont {
			s.Out = append(s.Out, ev...)
		}
		return
	case s.Committed && s.Stuck != "": // nothing more to learn from it
		s.Ended = s.Ended || finished(ev)
		s.emit(ev)
		return
	case s.Committed && !s.cont:
		s.scan(ev, data)
		return
	}
	ch := &s.ch
	ch.Choices, ch.Usage, ch.Error, ch.ID, ch.Created = ch.Choices[:0], false, nil, "", nil
	if err := json.Unmarshal(data, ch); err != nil {
		s.Stuck = "an event is not JSON"
		s.emit(ev)
		return
	}
	if len(ch.Error) > 0 && string(ch.Error) != "null" {
		s.errorEvent(ev, ch.Error)
		return
	}
	content := s.choices(ch)
	s.learnIDs(ch)
	if !s.Committed && !content && !s.Ended {
		if !s.cont {
			s.Out = append(s.Out, ev...)
		}
		return // a continuation's role chunk: the client has one
	}
	s.Committed = true
	if s.cont && len(ch.Choices) == 0 && bool(ch.Usage) {
		s.emitUsage(data)
		return
	}
	s.emit(ev)
}

// scan reads a committed event of the first replica without decoding it
// whole, in one pass (facts): its text, whether it ends the stream,
// whether it makes the stream impossible to continue (reasoning, tool
// calls). vLLM sends one such event per token.
func (s *Splice) scan(ev, data []byte) {
	s.f, s.scanned = scan(ev), true
	f := &s.f
	switch {
	case bytes.HasPrefix(data, errorKey):
		s.Ended = true
	case f.reasoning:
		s.Stuck = "the reply has reasoning content"
	case f.toolCalls:
		s.Stuck = "the reply has tool calls"
	}
	q, has := f.text, f.hasText
	if s.Chat {
		q, has = f.content, f.hasContent
	}
	n := len(s.Text)
	text, ok := s.Text, false
	if q >= 0 {
		text, ok = appendUnquoted(s.Text, ev[q+1:f.de])
	}
	if !ok && has && !f.emptyChoices {
		s.Stuck = "an event could not be read"
	}
	if s.Text = text; len(text) > n {
		s.Tokens++
	}
	s.Ended = s.Ended || f.finished
	s.emit(ev)
}

// choices notes what the event's choices carry and reports whether it
// has content (text, a tool call, reasoning) or an end.
func (s *Splice) choices(ch *chunk) bool {
	content := false
	for i := range ch.Choices {
		c := &ch.Choices[i]
		if c.Index != 0 {
			s.Stuck = "the request asks for several choices"
		}
		if bool(c.FinishReason) {
			s.Ended, content = true, true
		}
		if c.Delta.Reasoning != "" {
			s.Stuck, content = "the reply has reasoning content", true
		}
		if bool(c.Delta.ToolCalls) {
			s.Stuck, content = "the reply has tool calls", true
		}
		if text := c.Text + c.Delta.Content; text != "" {
			content = true
			s.Text = append(s.Text, text...)
			s.Tokens++
		}
	}
	return content
}

// learnIDs keeps the first replica's chunk id and created, and a
// continuation's own, from the first event that has them.
func (s *Splice) learnIDs(ch *chunk) {
	if (!s.cont && s.ID != "") || (s.cont && s.contID != "") || ch.ID == "" {
		return
	}
	if s.cont {
		s.contID, s.contCreated = string(ch.ID), ch.Created
	} else {
		s.ID, s.Created = string(ch.ID), ch.Created
	}
}

// errorEvent handles an engine's error event: before the first token the
// attempt failed (and is retried); after it the event ends the stream.
func (s *Splice) errorEvent(ev, e []byte) {
	if !s.Committed {
		var ae struct {
			Message string `json:"message"`
		}
		json.Unmarshal(e, &ae)
		s.Failed, s.FailMessage = true, ae.Message
		return
	}
	s.Ended = true
	s.emit(ev)
}

// emit appends ev to Out, a continuation's with the first replica's
// chunk id and created in place of its own.
func (s *Splice) emit(ev []byte) {
	if !s.cont {
		s.Out = append(s.Out, ev...)
		return
	}
	if s.contID != "" && s.contID != s.ID {
		ev = replaceOnce(&s.Out, ev, strconv.AppendQuote(nil, s.contID), strconv.AppendQuote(nil, s.ID))
	}
	if len(s.contCreated) > 0 && !bytes.Equal(s.contCreated, s.Created) {
		ev = replaceOnce(&s.Out, ev, append([]byte(`"created":`), s.contCreated...), append([]byte(`"created":`), s.Created...))
	}
	s.Out = append(s.Out, ev...)
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

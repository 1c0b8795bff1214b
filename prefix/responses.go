package prefix

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// Thread is what a Responses API request says about the conversation it
// continues, besides its prompt.
type Thread struct {
	// Previous is "previous_response_id": the response this request
	// continues, empty for none.
	Previous string
	// NoStore is "store": false: the engine keeps no copy of the response,
	// so no later request can continue it.
	NoStore bool
	// Instructions says the Prompt's first message is "instructions" (a
	// system message): the history of Previous goes after it.
	Instructions bool
}

// ParseResponses reads an OpenAI Responses API request body
// (POST /v1/responses) under limits l into the chat Prompt an engine
// renders for it, as vLLM's serving_responses builds it
// (_construct_input_messages, construct_tool_dicts):
//
//   - "instructions" is a leading system message;
//   - "input" is a user message when it is a string, else its items in
//     order: a message item (with or without "type": "message") is a chat
//     message, its input_text and output_text parts joined with "\n"; a
//     function_call item is an assistant tool call (consecutive ones, and
//     one right after an assistant message, join that message's
//     tool_calls); a function_call_output item is a tool message;
//     reasoning and other items are not rendered;
//   - each function tool {"type":"function","name","description",
//     "parameters"} is the chat tool {"type":"function","function":
//     {"name","description","parameters"}}, so a Responses request and a
//     chat request with the same tool schema render the same; other
//     tools are not rendered, and none are when "tool_choice" is "none";
//   - "max_output_tokens" is MaxTokens; "text" (the response format) is
//     not rendered: engines apply it to decoding, not to the prompt.
//
// The history of "previous_response_id" is not in the body: the caller
// prepends it (the messages of the request continued and its output).
// Limits apply as to chat: input items count as messages, content parts
// as parts, tools as tools.
func (l Limits) ParseResponses(body []byte) (*Prompt, Thread, error) {
	s := scanner{b: body, lim: l.resolved()}
	r := responsesReq{p: &Prompt{Chat: true}}
	if err := s.responses(&r); err != nil {
		return nil, Thread{}, malformed("", err)
	}
	p := r.p
	if p.Model == "" {
		return nil, Thread{}, ErrNoModel
	}
	if r.maxTokens < 0 {
		return nil, Thread{}, fmt.Errorf("%w: %w", ErrMalformed,
			&FieldError{"max_output_tokens", fmt.Errorf("%w: got %d, want >= 0", ErrRange, r.maxTokens)})
	}
	p.MaxTokens = r.maxTokens
	if r.instructions != "" {
		r.thread.Instructions = true
		p.Messages = append([]Message{{Role: "system", Content: r.instructions}}, p.Messages...)
	}
	if len(p.Messages) == 0 && r.thread.Previous == "" {
		return nil, Thread{}, fmt.Errorf("%w: input is empty", ErrNoPrompt)
	}
	if !r.toolsNone && len(r.tools) > 0 {
		p.Tools = appendToolList(nil, r.tools)
	}
	return p, r.thread, nil
}

// responsesReq is what ParseResponses reads before it builds the Prompt.
type responsesReq struct {
	p            *Prompt
	thread       Thread
	instructions string
	tools        [][]byte // each a chat tool's JSON
	toolsNone    bool     // tool_choice "none"
	maxTokens    int
}

// appendToolList appends the JSON array of tools to dst.
func appendToolList(dst []byte, tools [][]byte) []byte {
	dst = append(dst, '[')
	for i, t := range tools {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, t...)
	}
	return append(dst, ']')
}

// object reads an object (or null) member by member, calling f with each
// key; f consumes the value.
func (s *scanner) object(field string, f func(key []byte) error) error {
	if null, err := s.null(); null || err != nil {
		return err
	}
	if s.ws() != '{' {
		return s.typeErr(field, "an object")
	}
	if err := s.down(); err != nil {
		return err
	}
	defer s.up()
	s.i++
	for n := 0; ; n++ {
		more, err := s.more('}', n)
		if err != nil || !more {
			return err
		}
		k, err := s.objectKey()
		if err != nil {
			return err
		}
		if err := f(k); err != nil {
			return err
		}
	}
}

// array reads an array (or null) element by element, at most limit of
// them (sentinel past it), calling f for each; f consumes the element.
func (s *scanner) array(field string, limit int, sentinel error, f func(n int) error) error {
	if null, err := s.null(); null || err != nil {
		return err
	}
	if s.ws() != '[' {
		return s.typeErr(field, "an array")
	}
	s.i++
	n := 0
	return s.eachUpTo(limit, sentinel, func() error {
		n++
		return f(n - 1)
	})
}

// responses reads the top-level object of a Responses request.
func (s *scanner) responses(r *responsesReq) error {
	if s.ws() != '{' {
		return s.syntaxErr("{")
	}
	err := s.object("request", func(k []byte) error {
		var err error
		switch string(k) {
		case "model":
			r.p.Model, err = s.text("model")
		case "input":
			err = s.input(r.p)
		case "instructions":
			r.instructions, err = s.text("instructions")
		case "tools":
			err = s.responseTools(r)
		case "tool_choice":
			r.toolsNone = false
			if s.ws() == '"' {
				var c string
				c, err = s.text("tool_choice")
				r.toolsNone = c == "none"
			} else {
				err = s.skip()
			}
		case "previous_response_id":
			r.thread.Previous, err = s.text("previous_response_id")
		case "store":
			r.thread.NoStore = false
			if null, e := s.null(); !null && e == nil { // null: the default, true
				var store bool
				store, err = s.boolean("store")
				r.thread.NoStore = !store
			} else {
				err = e
			}
		case "user":
			r.p.User, err = s.text("user")
		case "stream":
			r.p.Stream, err = s.boolean("stream")
		case "max_output_tokens":
			r.maxTokens, _, err = s.maxTokens("max_output_tokens")
		default:
			err = s.skip()
		}
		if errors.Is(err, ErrType) {
			err = &FieldError{string(k), err}
		}
		return err
	})
	if err != nil {
		return err
	}
	if s.ws(); s.i < len(s.b) {
		return s.syntaxErr("the end of the body")
	}
	return nil
}

// input reads "input": a string (one user message) or an array of items.
func (s *scanner) input(p *Prompt) error {
	p.Messages = p.Messages[:0]
	if s.ws() == '"' {
		t, err := s.text("input")
		p.Messages = append(p.Messages, Message{Role: "user", Content: t})
		return err
	}
	return s.array("input", s.lim.Messages, ErrTooManyMessages, func(n int) error {
		if err := s.inputItem(p); err != nil {
			return fmt.Errorf("input item %d: %w", n, err)
		}
		return nil
	})
}

// item is one input item's fields, as read.
type item struct {
	typ, role, content, callID, output string
	name, args, callIDRaw              []byte // raw JSON strings
}

// inputItem reads one input item and appends what it renders to
// p.Messages.
func (s *scanner) inputItem(p *Prompt) error {
	var it item
	if s.ws() != '{' {
		return s.typeErr("input item", "an object")
	}
	err := s.object("input item", func(k []byte) error {
		var err error
		switch string(k) {
		case "type":
			it.typ, err = s.text("type")
		case "role":
			it.role, err = s.text("role")
		case "content":
			it.content, err = s.itemContent()
		case "call_id":
			s.ws()
			from := s.i
			if it.callID, err = s.text("call_id"); err == nil {
				it.callIDRaw = s.b[from:s.i]
			}
		case "name":
			it.name, err = s.rawString("name")
		case "arguments":
			it.args, err = s.rawString("arguments")
		case "output":
			if s.ws() == '"' {
				it.output, err = s.text("output")
			} else {
				it.output, err = s.itemContent()
			}
		default:
			err = s.skip()
		}
		return err
	})
	if err != nil {
		return err
	}
	it.render(p)
	return nil
}

// rawString reads a string (or null) and returns its JSON bytes as in the
// body (nil for null).
func (s *scanner) rawString(field string) ([]byte, error) {
	switch s.ws() {
	case '"':
		from := s.i
		_, err := s.str(nil, false)
		return s.b[from:s.i:s.i], err
	case 'n':
		return nil, s.literal("null")
	}
	return nil, s.typeErr(field, "a string")
}

// render appends the chat messages of it to p.Messages.
func (it *item) render(p *Prompt) {
	switch it.typ {
	case "", "message":
		if it.role != "" {
			p.Messages = appendDoubling(p.Messages, Message{Role: it.role, Content: it.content})
		}
	case "function_call":
		call := it.toolCall()
		if n := len(p.Messages); n > 0 && p.Messages[n-1].Role == "assistant" {
			m := &p.Messages[n-1]
			if len(m.ToolCalls) == 0 {
				m.ToolCalls = append([]byte{'['}, call...)
			} else {
				m.ToolCalls = append(append(m.ToolCalls[:len(m.ToolCalls)-1:len(m.ToolCalls)-1], ','), call...)
			}
			m.ToolCalls = append(m.ToolCalls, ']')
			return
		}
		p.Messages = appendDoubling(p.Messages, Message{Role: "assistant", ToolCalls: append(append([]byte{'['}, call...), ']')})
	case "function_call_output":
		p.Messages = appendDoubling(p.Messages, Message{Role: "tool", Content: it.output, ToolCallID: it.callID})
	}
}

// toolCall is the chat tool call of a function_call item:
// {"id","type":"function","function":{"name","arguments"}}.
func (it *item) toolCall() []byte {
	b := []byte(`{"id":`)
	b = appendRawOr(b, it.callIDRaw)
	b = append(b, `,"type":"function","function":{"name":`...)
	b = appendRawOr(b, it.name)
	b = append(b, `,"arguments":`...)
	b = appendRawOr(b, it.args)
	return append(b, "}}"...)
}

// appendRawOr appends raw, or "" when it is nil.
func appendRawOr(dst, raw []byte) []byte {
	if raw == nil {
		return append(dst, `""`...)
	}
	return append(dst, raw...)
}

// itemContent reads an item's content: a string, null, or an array of
// parts, the text of input_text, output_text and text parts joined with
// "\n" and any other part kept as its raw JSON (as content does for chat).
func (s *scanner) itemContent() (string, error) {
	if s.ws() != '[' {
		return s.text("content")
	}
	var buf []byte
	err := s.array("content", math.MaxInt, nil, func(n int) error {
		if s.parts++; s.parts > s.lim.Parts {
			return s.limitErr(ErrTooManyParts, s.lim.Parts)
		}
		if n > 0 {
			buf = append(buf, '\n')
		}
		var err error
		if buf, err = s.itemPart(buf); err != nil {
			return fmt.Errorf("content part %d: %w", n, err)
		}
		return nil
	})
	return string(buf), err
}

// itemPart appends one content part to buf: its text, or its raw JSON.
func (s *scanner) itemPart(buf []byte) ([]byte, error) {
	s.ws()
	from := s.i
	if s.ws() != '{' {
		return buf, s.typeErr("content part", "an object")
	}
	typ, text := "", ""
	hasText := false
	err := s.object("content part", func(k []byte) error {
		var err error
		switch string(k) {
		case "type":
			typ, err = s.text("type")
		case "text":
			text, err = s.text("text")
			hasText = true
		default:
			err = s.skip()
		}
		return err
	})
	if err != nil {
		return buf, err
	}
	switch typ {
	case "input_text", "output_text", "text":
		if hasText {
			return append(buf, text...), nil
		}
		return buf, nil
	}
	return append(buf, s.b[from:s.i]...), nil
}

// responseTools reads "tools", keeping each function tool in its chat
// form (see ParseResponses).
func (s *scanner) responseTools(r *responsesReq) error {
	r.tools = r.tools[:0]
	return s.array("tools", s.lim.Tools, ErrTooManyTools, func(n int) error {
		t, err := s.responseTool()
		if err != nil {
			return fmt.Errorf("tool %d: %w", n, err)
		}
		if t != nil {
			r.tools = append(r.tools, t)
		}
		return nil
	})
}

// responseTool reads one tool and returns its chat form, nil for a tool
// that is not a function.
func (s *scanner) responseTool() ([]byte, error) {
	if s.ws() != '{' {
		return nil, s.typeErr("tool", "an object")
	}
	var typ string
	var name, desc, params []byte
	err := s.object("tool", func(k []byte) error {
		var err error
		switch string(k) {
		case "type":
			typ, err = s.text("type")
		case "name":
			name, err = s.rawString("name")
		case "description":
			desc, err = s.rawString("description")
		case "parameters":
			s.ws()
			from := s.i
			if err = s.skip(); err == nil {
				params = s.b[from:s.i:s.i]
			}
		default:
			err = s.skip()
		}
		return err
	})
	if err != nil || typ != "function" {
		return nil, err
	}
	b := []byte(`{"type":"function","function":{"name":`)
	b = appendRawOr(b, name)
	if desc != nil {
		b = append(b, `,"description":`...)
		b = append(b, desc...)
	}
	if params != nil && !bytes.Equal(params, []byte("null")) {
		b = append(b, `,"parameters":`...)
		var c bytes.Buffer
		if json.Compact(&c, params) == nil {
			b = append(b, c.Bytes()...)
		} else {
			b = append(b, params...)
		}
	}
	return append(b, "}}"...), nil
}

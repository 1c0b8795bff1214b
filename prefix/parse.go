package prefix

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"unsafe"
)

// Prompt is what the router reads from an OpenAI request body: enough to
// route it, parsed once. The body itself is forwarded unchanged.
type Prompt struct {
	// Model is the requested model. vLLM names a LoRA adapter here too, so
	// it also covers the adapter.
	Model string
	// Chat is true for a chat request (a "messages" field), false for a
	// completions request (a "prompt" field).
	Chat bool
	// Messages are the chat messages, in order.
	Messages []Message
	// Prompts are the completions prompts given as text: one for a string
	// prompt, several for an array of strings.
	Prompts []string
	// PromptIDs are the completions prompts given as token ids: one for an
	// array of integers, several for an array of arrays.
	PromptIDs [][]uint32
	// Tools is the raw JSON of the "tools" field, nil when absent.
	Tools json.RawMessage
	// User is the OpenAI "user" field, empty when absent.
	User string
	// Stream is the "stream" field.
	Stream bool
	// IncludeUsage is "stream_options.include_usage".
	IncludeUsage bool
	// StreamOptionsAt and IncludeUsageAt are the byte ranges [start, end)
	// in the body of the "stream_options" value and of its include_usage
	// value (zero when absent), so that a router can set include_usage
	// without encoding the body again.
	StreamOptionsAt, IncludeUsageAt [2]int
	// KVTransferParamsAt is the byte range [start, end) in the body of the
	// "kv_transfer_params" value (zero when absent), which a router checks
	// before an engine acts on it.
	KVTransferParamsAt [2]int
	// MaxTokens is "max_completion_tokens", else "max_tokens"; zero when
	// neither is set.
	MaxTokens int
}

// Message is one chat message with its content flattened to text.
type Message struct {
	Role string
	// Content is the message text. An array of parts is flattened: text
	// parts joined with "\n" (as vLLM does), any other part (an image, an
	// audio clip) kept as its raw JSON so that it still tells prompts apart.
	Content string
	// Name, ToolCallID and ToolCalls (raw JSON) are kept because they are
	// part of what the engine renders.
	Name       string
	ToolCallID string
	ToolCalls  json.RawMessage
}

// Errors Parse returns (wrapped), for the proxy to map to OpenAI errors.
var (
	// ErrMalformed: the body is not a JSON object of the expected shape.
	ErrMalformed = errors.New("malformed request body")
	// ErrNoModel: the "model" field is missing or empty.
	ErrNoModel = errors.New("missing model")
	// ErrNoPrompt: neither "messages" nor "prompt" is present, or
	// "messages" is empty.
	ErrNoPrompt = errors.New("request has neither messages nor prompt")
	// ErrType: a field's value has the wrong JSON type (wrapped in a
	// FieldError naming the top-level field).
	ErrType = errors.New("wrong type")
	// ErrRange: a field's value is outside its range, such as a negative
	// max_tokens (wrapped in a FieldError naming the field).
	ErrRange = errors.New("value out of range")
)

// FieldError is an error in the value of one top-level field of the
// request, such as "max_tokens" or "messages": OpenAI's "param".
type FieldError struct {
	Field string
	Err   error
}

// Error implements error.
func (e *FieldError) Error() string { return e.Field + ": " + e.Err.Error() }

// Unwrap returns Err.
func (e *FieldError) Unwrap() error { return e.Err }

// Parse reads an OpenAI chat or completions request body under the
// default Limits. It returns an error wrapping ErrMalformed, ErrNoModel or
// ErrNoPrompt when the body cannot be routed, and one wrapping ErrLimit
// when it is past a limit (see Limits.Parse).
//
// It reads the body in one pass (see scanner) and copies every string it
// keeps, so the Prompt does not alias body. A "null" field
// counts as absent.
func Parse(body []byte) (*Prompt, error) {
	return parse(body, Limits{}.resolved())
}

// parse is Parse under the resolved limits lim.
func parse(body []byte, lim Limits) (*Prompt, error) {
	s := scanner{b: body, lim: lim}
	p := &Prompt{}
	var f fields
	if err := s.request(p, &f); err != nil {
		return nil, malformed("", err)
	}
	if p.Model == "" {
		return nil, ErrNoModel
	}
	field := ""
	switch {
	case f.hasMaxCompletion:
		p.MaxTokens, field = f.maxCompletion, "max_completion_tokens"
	case f.hasMax:
		p.MaxTokens, field = f.max, "max_tokens"
	}
	if p.MaxTokens < 0 {
		return nil, fmt.Errorf("%w: %w", ErrMalformed,
			&FieldError{field, fmt.Errorf("%w: got %d, want >= 0", ErrRange, p.MaxTokens)})
	}
	switch {
	case p.Chat:
		if len(p.Messages) == 0 {
			return nil, fmt.Errorf("%w: messages is empty", ErrNoPrompt)
		}
	case f.promptAt > 0:
		s.i, s.depth = f.promptAt, 1
		if err := s.prompt(p); err != nil {
			if errors.Is(err, ErrType) {
				return nil, malformed("", &FieldError{"prompt", err})
			}
			return nil, malformed("prompt: ", err)
		}
	default:
		return nil, ErrNoPrompt
	}
	return p, nil
}

// malformed wraps a scanner error in ErrMalformed, unless it is a limit
// error, returned as it is (with what, a prefix for its message).
func malformed(what string, err error) error {
	if errors.Is(err, ErrLimit) {
		return fmt.Errorf("%s%w", what, err)
	}
	return fmt.Errorf("%w: %s%w", ErrMalformed, what, err)
}

// fields holds what request reads before Parse interprets it.
type fields struct {
	max, maxCompletion       int
	hasMax, hasMaxCompletion bool
	promptAt                 int // offset of a non-null "prompt", else 0
}

// request reads the top-level object into p and f. The prompt is only
// validated: Parse decodes it if there are no messages.
func (s *scanner) request(p *Prompt, f *fields) error {
	if err := s.enter('{'); err != nil {
		return err
	}
	if err := s.down(); err != nil {
		return err
	}
	defer s.up()
	for n := 0; ; n++ {
		more, err := s.more('}', n)
		if err != nil {
			return err
		}
		if !more {
			break
		}
		if err := s.requestField(p, f); err != nil {
			return err
		}
	}
	if s.ws(); s.i < len(s.b) { // a NUL byte is not the end
		return s.syntaxErr("the end of the body")
	}
	return nil
}

// requestField reads one field of the top-level object.
func (s *scanner) requestField(p *Prompt, f *fields) error {
	k, err := s.objectKey()
	if err != nil {
		return err
	}
	var key [32]byte // k may be scratch the field's own keys reuse
	n := copy(key[:], k)
	switch string(k) {
	case "model":
		p.Model, err = s.text("model")
	case "messages":
		err = s.messages(p)
	case "prompt":
		f.promptAt = 0
		if null, err := s.null(); null || err != nil {
			return err
		}
		f.promptAt = s.i
		err = s.skip()
	case "tools":
		p.Tools, err = s.tools()
	case "user":
		p.User, err = s.text("user")
	case "stream":
		p.Stream, err = s.boolean("stream")
	case "stream_options":
		err = s.streamOptions(p)
	case "max_tokens":
		f.max, f.hasMax, err = s.maxTokens("max_tokens")
	case "max_completion_tokens":
		f.maxCompletion, f.hasMaxCompletion, err = s.maxTokens("max_completion_tokens")
	case "kv_transfer_params":
		s.ws()
		start := s.i
		if err = s.skip(); err == nil {
			p.KVTransferParamsAt = [2]int{start, s.i}
		}
	default:
		err = s.skip()
	}
	if errors.Is(err, ErrType) {
		err = &FieldError{string(key[:n]), err}
	}
	return err
}

// maxTokens reads an integer field that fits an int, or null.
func (s *scanner) maxTokens(field string) (int, bool, error) {
	v, ok, err := s.integer(field)
	if err == nil && (v > math.MaxInt || v < math.MinInt) {
		err = s.typeErr(field, "an int")
	}
	return int(v), ok, err
}

// streamOptions reads "stream_options": an object or null.
func (s *scanner) streamOptions(p *Prompt) error {
	p.IncludeUsage, p.IncludeUsageAt = false, [2]int{}
	s.ws()
	p.StreamOptionsAt[0] = s.i
	defer func() { p.StreamOptionsAt[1] = s.i }()
	if null, err := s.null(); null || err != nil {
		return err
	}
	if s.ws() != '{' {
		return s.typeErr("stream_options", "an object")
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
		if string(k) == "include_usage" {
			s.ws()
			at := s.i
			p.IncludeUsage, err = s.boolean("include_usage")
			p.IncludeUsageAt = [2]int{at, s.i}
		} else {
			err = s.skip()
		}
		if err != nil {
			return err
		}
	}
}

// messages reads "messages": an array of message objects, or null (absent).
func (s *scanner) messages(p *Prompt) error {
	p.Chat = false
	if null, err := s.null(); null || err != nil {
		p.Messages = nil
		return err
	}
	if s.ws() != '[' {
		return s.typeErr("messages", "an array")
	}
	if err := s.down(); err != nil {
		return err
	}
	defer s.up()
	s.i++
	// A repeated "messages" field reuses the array of the one before.
	p.Chat, s.parts, p.Messages = true, 0, p.Messages[:0]
	if p.Messages == nil {
		p.Messages = make([]Message, 0, 8)
	}
	for n := 0; ; n++ {
		more, err := s.more(']', n)
		if err != nil || !more {
			return err
		}
		if n >= s.lim.Messages {
			return s.limitErr(ErrTooManyMessages, s.lim.Messages)
		}
		var m Message
		if err := s.message(&m); err != nil {
			return fmt.Errorf("message %d: %w", n, err)
		}
		p.Messages = appendDoubling(p.Messages, m)
	}
}

// message reads one message object; null reads as a zero message.
func (s *scanner) message(m *Message) error {
	if null, err := s.null(); null || err != nil {
		return err
	}
	if s.ws() != '{' {
		return s.typeErr("message", "an object")
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
		switch string(k) {
		case "role":
			m.Role, err = s.text("role")
		case "content":
			m.Content, err = s.content()
		case "name":
			m.Name, err = s.text("name")
		case "tool_call_id":
			m.ToolCallID, err = s.text("tool_call_id")
		case "tool_calls":
			m.ToolCalls, err = s.raw()
		default:
			err = s.skip()
		}
		if err != nil {
			return err
		}
	}
}

// content reads a message's content: a string, null, or an array of parts
// flattened as Message.Content says.
func (s *scanner) content() (string, error) {
	if s.ws() != '[' {
		return s.text("content")
	}
	if err := s.down(); err != nil {
		return "", err
	}
	defer s.up()
	s.i++
	var buf []byte
	for n := 0; ; n++ {
		more, err := s.more(']', n)
		if err != nil {
			return "", err
		}
		if !more {
			return unsafe.String(unsafe.SliceData(buf), len(buf)), nil
		}
		if s.parts++; s.parts > s.lim.Parts {
			return "", s.limitErr(ErrTooManyParts, s.lim.Parts)
		}
		if n > 0 {
			buf = append(buf, '\n')
		}
		if buf, err = s.part(buf); err != nil {
			return "", fmt.Errorf("content part %d: %w", n, err)
		}
	}
}

// part appends one content part to buf: a text part's text, or any other
// part's raw JSON.
func (s *scanner) part(buf []byte) ([]byte, error) {
	s.ws()
	from := s.i
	if null, err := s.null(); null || err != nil {
		return append(buf, "null"...), err
	}
	if s.ws() != '{' {
		return buf, s.typeErr("content part", "an object")
	}
	if err := s.down(); err != nil {
		return buf, err
	}
	defer s.up()
	s.i++
	isText, textAt := false, 0
	for n := 0; ; n++ {
		more, err := s.more('}', n)
		if err != nil {
			return buf, err
		}
		if !more {
			break
		}
		if isText, textAt, err = s.partField(isText, textAt); err != nil {
			return buf, err
		}
	}
	if !isText {
		return append(buf, s.b[from:s.i]...), nil
	}
	if textAt > 0 {
		end := s.i
		s.i = textAt
		buf, _ = s.str(buf, true) // validated by partField
		s.i = end
	}
	return buf, nil
}

// partField reads one field of a content part: "type" (is it "text"?) and
// "text" (its offset, decoded by part once the type is known).
func (s *scanner) partField(isText bool, textAt int) (bool, int, error) {
	k, err := s.objectKey()
	if err != nil {
		return false, 0, err
	}
	switch string(k) {
	case "type":
		isText = false
		if s.ws() == '"' {
			t, err := s.str(s.key[:0], true)
			return err == nil && string(t) == "text", textAt, err
		}
		if null, err := s.null(); !null || err != nil {
			return false, 0, cmpErr(err, s.typeErr("type", "a string"))
		}
	case "text":
		textAt = 0
		if s.ws() == '"' {
			textAt = s.i
			_, err = s.str(nil, false)
			return isText, textAt, err
		}
		if null, err := s.null(); !null || err != nil {
			return false, 0, cmpErr(err, s.typeErr("text", "a string"))
		}
	default:
		err = s.skip()
	}
	return isText, textAt, err
}

// cmpErr returns err if it is not nil, else alt.
func cmpErr(err, alt error) error {
	if err != nil {
		return err
	}
	return alt
}

// prompt decodes a completions prompt: a string, an array of strings, an
// array of token ids, or an array of arrays of token ids.
func (s *scanner) prompt(p *Prompt) error {
	const want = "a string, an array of strings, or an array (of arrays) of token ids"
	switch s.ws() {
	case '"':
		t, err := s.text("prompt")
		p.Prompts = []string{t}
		return err
	case '[':
	default:
		return s.typeErr("prompt", want)
	}
	s.i++
	switch c := s.ws(); {
	case c == ']':
		return errors.New("empty array")
	case c == '"':
		return s.eachUpTo(s.lim.Prompts, ErrTooManyPrompts, func() error {
			if s.ws() != '"' {
				return s.typeErr("prompt", want)
			}
			t, err := s.text("prompt")
			p.Prompts = appendDoubling(p.Prompts, t)
			return err
		})
	case c == '[':
		return s.eachUpTo(s.lim.Prompts, ErrTooManyPrompts, func() error {
			if s.ws() != '[' {
				return s.typeErr("prompt", want)
			}
			s.i++
			ids := []uint32{}
			err := s.each(func() error {
				id, err := s.tokenID()
				ids = appendDoubling(ids, id)
				return err
			})
			p.PromptIDs = appendDoubling(p.PromptIDs, ids)
			return err
		})
	default:
		var ids []uint32
		err := s.each(func() error {
			id, err := s.tokenID()
			ids = appendDoubling(ids, id)
			return err
		})
		p.PromptIDs = [][]uint32{ids}
		return err
	}
}

// each calls f for every element of the array whose '[' was consumed.
func (s *scanner) each(f func() error) error {
	return s.eachUpTo(math.MaxInt, nil, f)
}

// eachUpTo is each for an array of at most limit elements, failing with
// sentinel (a limit error) at the first element past it.
func (s *scanner) eachUpTo(limit int, sentinel error, f func() error) error {
	if err := s.down(); err != nil {
		return err
	}
	defer s.up()
	for n := 0; ; n++ {
		more, err := s.more(']', n)
		if err != nil || !more {
			return err
		}
		if n >= limit {
			return s.limitErr(sentinel, limit)
		}
		if err := f(); err != nil {
			return err
		}
	}
}

// tokenID reads a token id: an integer in [0, 2^32).
func (s *scanner) tokenID() (uint32, error) {
	v, ok, err := s.integer("token id")
	if err == nil && (!ok || v < 0 || v > math.MaxUint32) {
		err = s.typeErr("token id", "an integer in [0, 2^32)")
	}
	return uint32(v), err
}

// appendDoubling appends v to s, doubling its capacity when it is full:
// append grows a large slice by a quarter at a time, which allocates about
// five times its final size in all; doubling allocates twice.
func appendDoubling[T any](s []T, v T) []T {
	if len(s) == cap(s) {
		s = append(make([]T, 0, max(2*len(s), 4)), s...)
	}
	return append(s, v)
}

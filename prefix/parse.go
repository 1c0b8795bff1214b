package prefix

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
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
)

// wireRequest is the subset of an OpenAI request Parse decodes.
type wireRequest struct {
	Model         string          `json:"model"`
	Messages      []wireMessage   `json:"messages"`
	Prompt        json.RawMessage `json:"prompt"`
	Tools         json.RawMessage `json:"tools"`
	User          string          `json:"user"`
	Stream        bool            `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens           *int `json:"max_tokens"`
	MaxCompletionTokens *int `json:"max_completion_tokens"`
}

type wireMessage struct {
	Role       string          `json:"role"`
	Content    content         `json:"content"`
	Name       string          `json:"name"`
	ToolCallID string          `json:"tool_call_id"`
	ToolCalls  json.RawMessage `json:"tool_calls"`
}

// content decodes a message's content: a string, null, or an array of parts.
type content string

type part struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// UnmarshalJSON implements json.Unmarshaler.
func (c *content) UnmarshalJSON(b []byte) error {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 || b[0] == 'n' {
		*c = ""
		return nil
	}
	if b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*c = content(s)
		return nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("content is neither a string nor an array of parts: %w", err)
	}
	var sb strings.Builder
	for i, r := range raw {
		var p part
		if err := json.Unmarshal(r, &p); err != nil {
			return fmt.Errorf("content part %d: %w", i, err)
		}
		if i > 0 {
			sb.WriteByte('\n')
		}
		if p.Type == "text" {
			sb.WriteString(p.Text)
		} else {
			sb.Write(bytes.TrimSpace(r))
		}
	}
	*c = content(sb.String())
	return nil
}

// Parse reads an OpenAI chat or completions request body. It returns an
// error wrapping ErrMalformed, ErrNoModel or ErrNoPrompt when the body
// cannot be routed.
func Parse(body []byte) (*Prompt, error) {
	var w wireRequest
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if w.Model == "" {
		return nil, ErrNoModel
	}
	p := &Prompt{
		Model:  w.Model,
		Tools:  w.Tools,
		User:   w.User,
		Stream: w.Stream,
	}
	if w.StreamOptions != nil {
		p.IncludeUsage = w.StreamOptions.IncludeUsage
	}
	switch {
	case w.MaxCompletionTokens != nil:
		p.MaxTokens = *w.MaxCompletionTokens
	case w.MaxTokens != nil:
		p.MaxTokens = *w.MaxTokens
	}
	if p.MaxTokens < 0 {
		return nil, fmt.Errorf("%w: max_tokens %d is negative", ErrMalformed, p.MaxTokens)
	}
	switch {
	case w.Messages != nil:
		if len(w.Messages) == 0 {
			return nil, fmt.Errorf("%w: messages is empty", ErrNoPrompt)
		}
		p.Chat = true
		p.Messages = make([]Message, len(w.Messages))
		for i, m := range w.Messages {
			p.Messages[i] = Message{Role: m.Role, Content: string(m.Content), Name: m.Name, ToolCallID: m.ToolCallID, ToolCalls: m.ToolCalls}
		}
	case len(w.Prompt) > 0 && !bytes.Equal(w.Prompt, []byte("null")):
		if err := parsePrompt(w.Prompt, p); err != nil {
			return nil, fmt.Errorf("%w: prompt: %v", ErrMalformed, err)
		}
	default:
		return nil, ErrNoPrompt
	}
	return p, nil
}

// parsePrompt decodes a completions prompt: a string, an array of strings,
// an array of token ids, or an array of arrays of token ids.
func parsePrompt(raw json.RawMessage, p *Prompt) error {
	var s string
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &s); err != nil {
			return err
		}
		p.Prompts = []string{s}
		return nil
	}
	var strs []string
	if err := json.Unmarshal(raw, &strs); err == nil {
		if len(strs) == 0 {
			return errors.New("empty array")
		}
		p.Prompts = strs
		return nil
	}
	var ids []uint32
	if err := json.Unmarshal(raw, &ids); err == nil {
		if len(ids) == 0 {
			return errors.New("empty array")
		}
		p.PromptIDs = [][]uint32{ids}
		return nil
	}
	var batch [][]uint32
	if err := json.Unmarshal(raw, &batch); err != nil {
		return errors.New("want a string, an array of strings, or an array (of arrays) of token ids")
	}
	if len(batch) == 0 {
		return errors.New("empty array")
	}
	p.PromptIDs = batch
	return nil
}

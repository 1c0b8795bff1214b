package emulator

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/kvrouter/kvrouter/engine"
)

// The OpenAI request and response shapes, as vLLM serves them
// (vllm/entrypoints/openai/protocol.py). Fields the emulator ignores
// (temperature, top_p, ...) are accepted and dropped.

// chatRequest is the body of POST /v1/chat/completions.
type chatRequest struct {
	Model               string         `json:"model"`
	Messages            []chatMessage  `json:"messages"`
	Tools               []chatTool     `json:"tools"`
	Stop                stopList       `json:"stop"`
	MaxTokens           *int           `json:"max_tokens"`
	MaxCompletionTokens *int           `json:"max_completion_tokens"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options"`
	User                string         `json:"user"`
	N                   *int           `json:"n"`
	AddGenerationPrompt *bool          `json:"add_generation_prompt"`
	// ContinueFinalMessage asks, as vLLM's continue_final_message does,
	// to continue the final (assistant) message instead of starting a
	// new one: it is rendered open, without its end-of-turn token.
	ContinueFinalMessage bool `json:"continue_final_message"`
	// KVTransferParams is vLLM's KV-connector field (prefill.go,
	// transfer.go).
	KVTransferParams *engine.TransferParams `json:"kv_transfer_params"`
}

// completionRequest is the body of POST /v1/completions.
type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	MaxTokens     *int            `json:"max_tokens"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	N             *int            `json:"n"`
	Stop          stopList        `json:"stop"`
	// KVTransferParams is vLLM's KV-connector field (prefill.go,
	// transfer.go).
	KVTransferParams *engine.TransferParams `json:"kv_transfer_params"`
}

// tokenizeRequest is the body of POST /tokenize: prompt or messages.
type tokenizeRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []chatMessage   `json:"messages"`
	Tools               []chatTool      `json:"tools"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
	ReturnTokenStrs     bool            `json:"return_token_strs"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// chatMessage accepts content as a string or as an array of parts
// ({"type":"text","text":...}); non-text parts are ignored. ToolCalls are
// an assistant message's (tools.go); tool_call_id is accepted and, as in
// Qwen3's template, not rendered.
type chatMessage struct {
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	ToolCalls json.RawMessage `json:"tool_calls,omitempty"`
}

func (m chatMessage) text() (string, error) {
	if len(m.Content) == 0 || string(m.Content) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(m.Content, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(m.Content, &parts); err != nil {
		return "", fmt.Errorf("message content must be a string or an array of parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return b.String(), nil
}

// renderMessages renders chat messages through the fixed template.
func renderMessages(msgs []chatMessage, generationPrompt bool) (string, error) {
	return renderWithTools(msgs, nil, generationPrompt)
}

// renderWithTools renders chat messages and tools (canonical, tools.go)
// through the fixed template.
func renderWithTools(msgs []chatMessage, tools []string, generationPrompt bool) (string, error) {
	if len(msgs) == 0 {
		return "", errors.New("messages must be a non-empty array")
	}
	ms := make([]Message, len(msgs))
	for i, m := range msgs {
		if m.Role == "" {
			return "", fmt.Errorf("messages[%d].role is required", i)
		}
		c, err := m.text()
		if err != nil {
			return "", fmt.Errorf("messages[%d]: %w", i, err)
		}
		calls, err := renderCalls(m.ToolCalls)
		if err != nil {
			return "", fmt.Errorf("messages[%d]: %w", i, err)
		}
		ms[i] = Message{Role: m.Role, Content: c, ToolCalls: calls}
	}
	return RenderChatTools(ms, tools, generationPrompt), nil
}

// renderContinued renders chat messages for continue_final_message: all
// but the last through the template, the last (an assistant message) left
// open, as vLLM renders it. It also returns the last message's text, the
// partial reply being continued.
func renderContinued(msgs []chatMessage) (text, partial string, err error) {
	if len(msgs) == 0 || msgs[len(msgs)-1].Role != "assistant" {
		return "", "", errors.New("continue_final_message needs a final message with role assistant")
	}
	last := len(msgs) - 1
	partial, err = msgs[last].text()
	if err != nil {
		return "", "", fmt.Errorf("messages[%d]: %w", last, err)
	}
	head := ""
	if last > 0 {
		if head, err = renderMessages(msgs[:last], false); err != nil {
			return "", "", err
		}
	}
	return head + "<|im_start|>assistant\n" + partial, partial, nil
}

// chatPrompt renders a chat request's prompt and returns where its output
// starts in the filler text: past the partial reply for
// continue_final_message (which, as in vLLM, excludes
// add_generation_prompt, true by default), else 0.
func chatPrompt(req *chatRequest) (text string, offset int, err error) {
	gen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
	if !req.ContinueFinalMessage {
		tools, err := renderTools(req.Tools)
		if err != nil {
			return "", 0, err
		}
		text, err = renderWithTools(req.Messages, tools, gen)
		return text, 0, err
	}
	if gen {
		//lint:ignore ST1005 vLLM's own message, verbatim
		return "", 0, errors.New("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	text, partial, err := renderContinued(req.Messages)
	return text, len(Tokenize(partial)), err
}

// promptTokens turns a completions prompt (a string, a one-element array of
// strings, or an array of token ids) into tokens.
func promptTokens(raw json.RawMessage) ([]uint32, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, errors.New("prompt is required")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return Tokenize(s), nil
	}
	var ss []string
	if err := json.Unmarshal(raw, &ss); err == nil {
		if len(ss) != 1 {
			return nil, errors.New("only a single prompt is supported")
		}
		return Tokenize(ss[0]), nil
	}
	var ids []uint32
	if err := json.Unmarshal(raw, &ids); err == nil {
		return ids, nil
	}
	return nil, errors.New("prompt must be a string, an array of one string, or an array of token ids")
}

// usage is the OpenAI usage object; PromptTokensDetails is always present.
type usage struct {
	PromptTokens        int           `json:"prompt_tokens"`
	TotalTokens         int           `json:"total_tokens"`
	CompletionTokens    int           `json:"completion_tokens"`
	PromptTokensDetails promptDetails `json:"prompt_tokens_details"`
}

// nullUsage marshals as "usage": null, which vLLM puts on every stream
// chunk when stream_options.include_usage is set.
var nullUsage = json.RawMessage("null")

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type chatResponse struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	// Usage is a *usage, nullUsage, or nil (omitted).
	Usage any `json:"usage,omitempty"`
	// KVTransferParams are a prefill leg's params for its decode leg
	// (prefill.go), at the top level as vLLM puts them; omitted otherwise.
	KVTransferParams *engine.TransferParams `json:"kv_transfer_params,omitempty"`
}

type chatChoice struct {
	Index        int      `json:"index"`
	Message      *chatOut `json:"message,omitempty"`
	Delta        *chatOut `json:"delta,omitempty"`
	Logprobs     any      `json:"logprobs"`
	FinishReason *string  `json:"finish_reason"`
	StopReason   any      `json:"stop_reason"`
}

type chatOut struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type completionResponse struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	// Usage is a *usage, nullUsage, or nil (omitted).
	Usage any `json:"usage,omitempty"`
	// KVTransferParams are a prefill leg's params for its decode leg
	// (prefill.go), at the top level as vLLM puts them; omitted otherwise.
	KVTransferParams *engine.TransferParams `json:"kv_transfer_params,omitempty"`
}

type completionChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
	StopReason   any     `json:"stop_reason"`
}

// apiError is the OpenAI error body: {"error": {message, type, param, code}}.
type apiError struct {
	Error errorInfo `json:"error"`
}

type errorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// errorType maps a status to the OpenAI error type vLLM uses.
func errorType(status int) string {
	switch status {
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusRequestEntityTooLarge:
		return "RequestEntityTooLarge"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	}
	if status >= 500 {
		return "InternalServerError"
	}
	return "BadRequestError"
}

// writeError answers with an OpenAI-shaped JSON error.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeParamError(w, status, msg, "")
}

// writeParamError answers with an OpenAI-shaped JSON error naming the
// request parameter at fault; "" gives "param": null.
func writeParamError(w http.ResponseWriter, status int, msg, param string) {
	info := errorInfo{Message: msg, Type: errorType(status), Code: status}
	if param != "" {
		info.Param = &param
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(apiError{Error: info})
}

// writeJSON answers 200 with v as JSON.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// fillerWords are the output text: each is one token of the emulator's
// tokenizer, with or without a leading space.
var fillerWords = [...]string{
	"the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "ran",
	"to", "see", "what", "was", "new", "in", "town", "so", "far", "away",
}

// fillerWord is output token i: deterministic text, one token each. The
// first word of a chat reply has no leading space.
func fillerWord(i int, chat bool) string {
	w := fillerWords[i%len(fillerWords)]
	if i == 0 && chat {
		return strings.ToUpper(w[:1]) + w[1:]
	}
	return " " + w
}

// filler is the text of output tokens [from, to).
func filler(from, to int, chat bool) string {
	var b strings.Builder
	for i := from; i < to; i++ {
		b.WriteString(fillerWord(i, chat))
	}
	return b.String()
}

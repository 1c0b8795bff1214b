package emulator

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Tools in the emulator's chat template, as Qwen3's and Hermes' templates
// place them (facts from their chat_template; the markup is the
// emulator's own):
//
//	<|im_start|>system\n[{system prompt}\n\n]# Tools\n\n<tools>\n{tool}\n...</tools><|im_end|>\n
//
// the system prompt being the first message's content when its role is
// system; an assistant message's tool calls follow its content as
// "\n<tool_call>\n{"name":...,"arguments":...}\n</tool_call>" each. Every
// tool renders as the canonical JSON of its chat form
// {"type":"function","function":{"name","description","parameters"}},
// so a chat request and a Responses request with the same tool schema
// render the same bytes, whatever whitespace or extra fields they carry.

// chatTool is a chat request's tool; toolFunction its function.
type chatTool struct {
	Type     string       `json:"type"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name        string          `json:"name"`
	Description *string         `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// toolCall is a chat assistant message's tool call.
type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// renderedCall is how the template writes a tool call.
type renderedCall struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// renderTools returns each tool's canonical JSON, nil for none.
func renderTools(tools []chatTool) ([]string, error) {
	out := make([]string, 0, len(tools))
	for i, t := range tools {
		if t.Type != "function" || t.Function.Name == "" {
			return nil, fmt.Errorf("tools[%d]: want a function tool with a name", i)
		}
		if len(t.Function.Parameters) > 0 && string(t.Function.Parameters) == "null" {
			t.Function.Parameters = nil
		}
		b, err := json.Marshal(t)
		if err != nil {
			return nil, fmt.Errorf("tools[%d]: %w", i, err)
		}
		out = append(out, string(b))
	}
	return out, nil
}

// renderCalls renders a message's tool_calls (raw JSON) as the template
// writes them after the content.
func renderCalls(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var calls []toolCall
	if err := json.Unmarshal(raw, &calls); err != nil {
		return "", errors.New("tool_calls must be an array of function calls")
	}
	var b strings.Builder
	for _, c := range calls {
		args := json.RawMessage(c.Function.Arguments)
		if !json.Valid(args) {
			args, _ = json.Marshal(c.Function.Arguments)
		}
		out, err := json.Marshal(renderedCall{Name: c.Function.Name, Arguments: args})
		if err != nil {
			return "", err
		}
		b.WriteString("\n<tool_call>\n")
		b.Write(out)
		b.WriteString("\n</tool_call>")
	}
	return b.String(), nil
}

// RenderChatTools is RenderChat with tools (each its canonical JSON): they
// open the system turn as the package notes describe, and each message's
// ToolCalls (rendered) follow its content.
func RenderChatTools(messages []Message, tools []string, generationPrompt bool) string {
	var b strings.Builder
	if len(tools) > 0 {
		b.WriteString("<|im_start|>system\n")
		if len(messages) > 0 && messages[0].Role == "system" {
			b.WriteString(messages[0].Content)
			b.WriteString("\n\n")
			messages = messages[1:]
		}
		b.WriteString("# Tools\n\n<tools>\n")
		for _, t := range tools {
			b.WriteString(t)
			b.WriteString("\n")
		}
		b.WriteString("</tools><|im_end|>\n")
	}
	for _, m := range messages {
		b.WriteString("<|im_start|>")
		b.WriteString(m.Role)
		b.WriteString("\n")
		b.WriteString(m.Content)
		b.WriteString(m.ToolCalls)
		b.WriteString("<|im_end|>\n")
	}
	if generationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String()
}

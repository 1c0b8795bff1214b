package hashing

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/kvrouter/kvrouter/prefix"
)

// llama.cpp's llama-server tokenizes only text: its /tokenize reads
// {"content"} and answers {"tokens": []} to vLLM's {"model","messages"}.
// A chat is rendered first by POST /apply-template (the same rendering its
// chat completions use), then tokenized as the server tokenizes a prompt
// it is sent: with the special tokens the model adds (BOS) and markup
// parsed as special tokens.

// llamaCppTemplate is the body of POST /apply-template.
type llamaCppTemplate struct {
	Messages []chatMessage   `json:"messages"`
	Tools    json.RawMessage `json:"tools,omitempty"`
}

// llamaCppTokenize is the body of llama.cpp's POST /tokenize.
type llamaCppTokenize struct {
	Content      string `json:"content"`
	AddSpecial   bool   `json:"add_special"`
	ParseSpecial bool   `json:"parse_special"`
}

// llamaCpp asks the llama.cpp replica at base for p's tokens.
func (r *remoteTokenizer) llamaCpp(ctx context.Context, base string, p *prefix.Prompt) ([]uint32, error) {
	text := ""
	if p.Chat {
		body, err := json.Marshal(llamaCppTemplate{Messages: chatMessages(p.Messages), Tools: p.Tools})
		if err != nil {
			return nil, err
		}
		var v struct {
			Prompt *string `json:"prompt"`
		}
		if err := r.post(ctx, base, "/apply-template", body, &v); err != nil {
			return nil, err
		}
		if v.Prompt == nil {
			return nil, fmt.Errorf("tokenize %s/apply-template: no prompt in the answer", base)
		}
		text = *v.Prompt
	} else {
		if len(p.Prompts) == 0 {
			return nil, fmt.Errorf("no text prompt")
		}
		text = p.Prompts[0]
	}
	body, err := json.Marshal(llamaCppTokenize{Content: text, AddSpecial: true, ParseSpecial: true})
	if err != nil {
		return nil, err
	}
	var v struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := r.post(ctx, base, "/tokenize", body, &v); err != nil {
		return nil, err
	}
	return v.Tokens, nil
}

package sse

import (
	"encoding/json"
	"errors"
	"fmt"
)

// contUsage is the usage of a continuation, rewritten for the whole reply.
type contUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details,omitempty"`
}

// emitUsage appends a continuation's usage-only event with the usage of
// the whole reply, so that nothing is counted twice: completion tokens are
// the continuation's plus those sent before it, the prompt is the
// continuation's net of the partial reply it carried (counted as the
// content events sent before, one token each, as vLLM streams them).
func (s *Splice) emitUsage(data []byte) {
	var m map[string]json.RawMessage
	var u contUsage
	if json.Unmarshal(data, &m) != nil || json.Unmarshal(m["usage"], &u) != nil {
		s.emit(append(append([]byte("data: "), data...), EventEnd...))
		return
	}
	u.PromptTokens = max(u.PromptTokens-s.before, 0)
	u.CompletionTokens += s.before
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	if d := u.PromptTokensDetails; d != nil {
		d.CachedTokens = min(d.CachedTokens, u.PromptTokens)
	}
	m["usage"], _ = json.Marshal(&u)
	m["id"], _ = json.Marshal(s.ID)
	if len(s.Created) > 0 {
		m["created"] = s.Created
	}
	b, _ := json.Marshal(m)
	s.Out = append(s.Out, "data: "...)
	s.Out = append(s.Out, b...)
	s.Out = append(s.Out, EventEnd...)
}

// ContinueBody returns orig, a chat or completions request, asking to
// continue after text, generated tokens long: for chat, the conversation
// plus the partial assistant message with continue_final_message (vLLM's
// extension; add_generation_prompt false), for completions the prompt plus
// the text; max_tokens (and max_completion_tokens, min_tokens) reduced by
// generated. It fails for what cannot be continued this way: echo, several
// choices, a prompt of token ids, no tokens left.
func ContinueBody(orig []byte, chat bool, text string, generated int) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(orig, &m); err != nil {
		return nil, errors.New("the request is not a JSON object")
	}
	if isTrue(m["echo"]) {
		return nil, errors.New("the request asks for echo")
	}
	if n, ok := intField(m, "n"); ok && n != 1 {
		return nil, errors.New("the request asks for several choices")
	}
	for _, k := range []string{"max_tokens", "max_completion_tokens"} {
		if v, ok := intField(m, k); ok {
			if v-generated < 1 {
				return nil, fmt.Errorf("no tokens left of %s %d", k, v)
			}
			m[k] = json.RawMessage(fmt.Sprint(v - generated))
		}
	}
	if v, ok := intField(m, "min_tokens"); ok {
		m["min_tokens"] = json.RawMessage(fmt.Sprint(max(v-generated, 0)))
	}
	var err error
	if chat {
		err = continueChat(m, text)
	} else {
		err = continuePrompt(m, text)
	}
	if err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

// continueChat appends the partial reply to the conversation in m: as a
// new assistant message, or to the final one when the request already
// continued it.
func continueChat(m map[string]json.RawMessage, text string) error {
	var msgs []map[string]json.RawMessage
	if err := json.Unmarshal(m["messages"], &msgs); err != nil || len(msgs) == 0 {
		return errors.New("the request has no messages array")
	}
	if isTrue(m["continue_final_message"]) {
		last := msgs[len(msgs)-1]
		var content string
		if err := json.Unmarshal(last["content"], &content); err != nil {
			return errors.New("the final message's content is not a string")
		}
		last["content"], _ = json.Marshal(content + text)
	} else {
		c, _ := json.Marshal(text)
		msgs = append(msgs, map[string]json.RawMessage{"role": json.RawMessage(`"assistant"`), "content": c})
	}
	m["messages"], _ = json.Marshal(msgs)
	m["continue_final_message"] = json.RawMessage("true")
	m["add_generation_prompt"] = json.RawMessage("false")
	return nil
}

// continuePrompt appends text to the prompt in m: a string, or an array
// of one string.
func continuePrompt(m map[string]json.RawMessage, text string) error {
	var p string
	if err := json.Unmarshal(m["prompt"], &p); err == nil {
		m["prompt"], _ = json.Marshal(p + text)
		return nil
	}
	var ps []string
	if err := json.Unmarshal(m["prompt"], &ps); err == nil && len(ps) == 1 {
		m["prompt"], _ = json.Marshal([]string{ps[0] + text})
		return nil
	}
	return errors.New("the prompt is not a string (token ids, several prompts)")
}

// isTrue reports whether raw is the JSON true.
func isTrue(raw json.RawMessage) bool { return string(raw) == "true" }

// intField returns m[k] as an integer; ok is false when absent or null.
func intField(m map[string]json.RawMessage, k string) (int, bool) {
	raw, ok := m[k]
	if !ok || string(raw) == "null" {
		return 0, false
	}
	var v int
	if json.Unmarshal(raw, &v) != nil {
		return 0, false
	}
	return v, true
}

package emulator

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestContinueFinalMessage cuts a chat reply in two and asks for the rest
// with continue_final_message, as the router does when a replica dies
// mid-stream: the partial reply plus its continuation is the reply the
// engine gives in one go, streamed or not, and the prompt counts the
// partial reply.
func TestContinueFinalMessage(t *testing.T) {
	s := start(t, Config{})
	url := s.URL() + "/v1/chat/completions"
	user := map[string]any{"role": "user", "content": "tell me a story"}
	status, b := post(t, url, map[string]any{"model": "m", "max_tokens": 9, "messages": []any{user}})
	if status != http.StatusOK {
		t.Fatalf("whole reply: status %d: %s", status, b)
	}
	var whole testResponse
	if err := json.Unmarshal(b, &whole); err != nil {
		t.Fatal(err)
	}
	want := whole.Choices[0].Message.Content
	partial := filler(0, 4, true)
	if !strings.HasPrefix(want, partial) {
		t.Fatalf("reply %q does not start with %q", want, partial)
	}
	cont := map[string]any{"model": "m", "max_tokens": 5, "continue_final_message": true, "add_generation_prompt": false,
		"messages": []any{user, map[string]any{"role": "assistant", "content": partial}}}

	status, b = post(t, url, cont)
	var rest testResponse
	if err := json.Unmarshal(b, &rest); status != http.StatusOK || err != nil {
		t.Fatalf("continued: status %d, %v: %s", status, err, b)
	}
	if got := partial + rest.Choices[0].Message.Content; got != want {
		t.Errorf("partial + continuation = %q, want %q", got, want)
	}
	if got, want := rest.Usage.PromptTokens, whole.Usage.PromptTokens+4; got != want {
		t.Errorf("continued prompt: got %d tokens, want %d (the conversation and the 4-token partial reply)", got, want)
	}

	cont["stream"] = true
	st := streamPost(t, url, cont)
	var text strings.Builder
	for _, ev := range st.events {
		var r testResponse
		if json.Unmarshal([]byte(ev), &r) == nil && len(r.Choices) > 0 && r.Choices[0].Delta != nil && r.Choices[0].Delta.Content != nil {
			text.WriteString(*r.Choices[0].Delta.Content)
		}
	}
	if got := partial + text.String(); got != want {
		t.Errorf("streamed: partial + continuation = %q, want %q", got, want)
	}

	cont["add_generation_prompt"] = true
	if status, b := post(t, url, cont); status != http.StatusBadRequest {
		t.Errorf("continue_final_message with add_generation_prompt: status %d, want 400: %s", status, b)
	}
	delete(cont, "add_generation_prompt") // true by default, as in vLLM
	if status, _ := post(t, url, cont); status != http.StatusBadRequest {
		t.Errorf("continue_final_message without add_generation_prompt false: status %d, want 400", status)
	}
	cont["add_generation_prompt"] = false
	cont["messages"] = []any{user}
	if status, b := post(t, url, cont); status != http.StatusBadRequest {
		t.Errorf("continue_final_message after a user message: status %d, want 400: %s", status, b)
	}
}

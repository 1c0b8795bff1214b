package sse

import (
	"encoding/json"
	"testing"
)

func TestStringField(t *testing.T) {
	tests := []struct {
		data string
		want string
		ok   bool
	}{
		{`{"choices":[{"delta":{"content":"Hi"}}]}`, "Hi", true},
		{`{"choices":[{"delta":{"content": "a\"b\\c\n\u00e9\ud83d\ude00"}}]}`, "a\"b\\c\né😀", true},
		{`{"choices":[{"logprobs":{"content":[{"token":"x"}]},"delta":{"content":"y"}}]}`, "y", true},
		{`{"choices":[{"delta":{"role":"assistant"}}]}`, "", false},
		{`{"choices":[{"delta":{"content":null}}]}`, "", false},
		{`{"choices":[{"delta":{"content":"cut`, "", false},
		{`{"choices":[{"delta":{"content":"bad\q"}}]}`, "", false},
	}
	for _, tt := range tests {
		got, ok := StringField([]byte("pre:"), []byte(tt.data), contentKey)
		if ok != tt.ok || (ok && string(got) != "pre:"+tt.want) || (!ok && string(got) != "pre:") {
			t.Errorf("StringField(%s) = %q, %v; want %q, %v", tt.data, got, ok, tt.want, tt.ok)
		}
	}
	for _, tt := range []struct {
		data string
		want bool
	}{
		{`{"delta":{"tool_calls":[{"index":0}]}}`, true},
		{`{"delta":{"tool_calls":[]}}`, false},
		{`{"delta":{"tool_calls":null,"content":"x"}}`, false},
		{`{"delta":{"tool_calls": [ ]}}`, false},
	} {
		if got := HasValue([]byte(tt.data), toolCallsKey); got != tt.want {
			t.Errorf("HasValue(%s) = %v, want %v", tt.data, got, tt.want)
		}
	}
}

// FuzzStringField checks StringField against encoding/json on chunks
// carrying a content string: whatever s is, it decodes as json does.
//
//	go test -run='^$' -fuzz=FuzzStringField -fuzztime=20s ./proxy
func FuzzStringField(f *testing.F) {
	for _, s := range []string{"Hi", `a"b`, "é😀\n", "\x00", "\xed\xa0\x80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"delta": map[string]string{"content": s}}}})
		var want struct {
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(b, &want); err != nil {
			t.Skip()
		}
		got, ok := StringField(nil, b, contentKey)
		if !ok || string(got) != want.Choices[0].Delta.Content {
			t.Errorf("StringField(%s) = %q, %v; want %q", b, got, ok, want.Choices[0].Delta.Content)
		}
	})
}

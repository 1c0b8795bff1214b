package sse

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestContinueBody(t *testing.T) {
	tests := []struct {
		name      string
		chat      bool
		orig      string
		text      string
		generated int
		want      string // "" for an error
	}{
		{"chat", true, `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}],"stream":true}`, "The cat", 2,
			`{"add_generation_prompt":false,"continue_final_message":true,"max_tokens":8,"messages":[{"role":"user","content":"hi"},{"content":"The cat","role":"assistant"}],"model":"m","stream":true}`},
		{"chat already continuing", true, `{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Once"}],"continue_final_message":true,"add_generation_prompt":false,"max_completion_tokens":5}`, " upon", 1,
			`{"add_generation_prompt":false,"continue_final_message":true,"max_completion_tokens":4,"messages":[{"content":"hi","role":"user"},{"content":"Once upon","role":"assistant"}]}`},
		{"completion", false, `{"prompt":"a b","max_tokens":3,"min_tokens":2}`, " c d", 2, `{"max_tokens":1,"min_tokens":0,"prompt":"a b c d"}`},
		{"completion one-string array", false, `{"prompt":["a"]}`, " b", 1, `{"prompt":["a b"]}`},
		{"token ids", false, `{"prompt":[1,2,3]}`, " b", 1, ""},
		{"no tokens left", true, `{"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, "a b", 2, ""},
		{"echo", false, `{"prompt":"a","echo":true}`, " b", 1, ""},
		{"n=2", true, `{"n":2,"messages":[{"role":"user","content":"hi"}]}`, "a", 1, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ContinueBody([]byte(tt.orig), tt.chat, tt.text, tt.generated)
			if tt.want == "" {
				if err == nil {
					t.Errorf("got %s, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var g, w any
			json.Unmarshal(got, &g)
			json.Unmarshal([]byte(tt.want), &w)
			if diff := cmp.Diff(w, g); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
		})
	}
}

package prefix

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const weatherTool = `{"type":"function","name":"get_weather","description":"Weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}`

// weatherChatTool is weatherTool as a chat client sends it.
const weatherChatTool = `{"type":"function","function":{"name":"get_weather","description":"Weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}`

func TestParseResponses(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		want   *Prompt
		thread Thread
	}{
		{"string input", `{"model":"m","input":"hi"}`,
			&Prompt{Model: "m", Chat: true, Messages: []Message{{Role: "user", Content: "hi"}}}, Thread{}},
		{"instructions lead", `{"model":"m","instructions":"be brief","input":"hi","max_output_tokens":7,"stream":true,"user":"u"}`,
			&Prompt{Model: "m", Chat: true, Stream: true, User: "u", MaxTokens: 7,
				Messages: []Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}}}, Thread{Instructions: true}},
		{"items", `{"model":"m","previous_response_id":"resp_1","store":false,"input":[
			{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"},{"type":"input_image","image_url":"x"}]},
			{"type":"message","role":"assistant","content":[{"type":"output_text","text":"ok"}]},
			{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"x\":1}"},
			{"type":"function_call","call_id":"c2","name":"g","arguments":"{}"},
			{"type":"reasoning","summary":[]},
			{"type":"function_call_output","call_id":"c1","output":"sunny"}]}`,
			&Prompt{Model: "m", Chat: true, Messages: []Message{
				{Role: "user", Content: "a\nb\n" + `{"type":"input_image","image_url":"x"}`},
				{Role: "assistant", Content: "ok", ToolCalls: []byte(`[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}},{"id":"c2","type":"function","function":{"name":"g","arguments":"{}"}}]`)},
				{Role: "tool", Content: "sunny", ToolCallID: "c1"},
			}}, Thread{Previous: "resp_1", NoStore: true}},
		{"function tools in chat form", `{"model":"m","input":"w?","tools":[` + weatherTool + `,{"type":"web_search"}],"text":{"format":{"type":"json_object"}}}`,
			&Prompt{Model: "m", Chat: true, Tools: []byte(`[` + weatherChatTool + `]`), Messages: []Message{{Role: "user", Content: "w?"}}}, Thread{}},
		{"tool_choice none renders no tools", `{"model":"m","input":"w?","tool_choice":"none","tools":[` + weatherTool + `]}`,
			&Prompt{Model: "m", Chat: true, Messages: []Message{{Role: "user", Content: "w?"}}}, Thread{}},
		{"a follow-up may carry no input", `{"model":"m","previous_response_id":"r","input":[]}`,
			&Prompt{Model: "m", Chat: true}, Thread{Previous: "r"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, th, err := Limits{}.ParseResponses([]byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, p, cmp.Comparer(func(a, b []byte) bool { return string(a) == string(b) })); d != "" {
				t.Errorf("prompt (-want +got):\n%s", d)
			}
			if th != tc.thread {
				t.Errorf("thread %+v, want %+v", th, tc.thread)
			}
		})
	}
}

func TestParseResponsesErrors(t *testing.T) {
	many := func(open, elem, close string, n int) string {
		return open + strings.TrimSuffix(strings.Repeat(elem+",", n), ",") + close
	}
	tests := []struct {
		name string
		body string
		want error
	}{
		{"not JSON", `{"model":`, ErrMalformed},
		{"no model", `{"input":"x"}`, ErrNoModel},
		{"no input", `{"model":"m"}`, ErrNoPrompt},
		{"input of a number", `{"model":"m","input":3}`, ErrType},
		{"item of a string", `{"model":"m","input":["x"]}`, ErrType},
		{"negative max_output_tokens", `{"model":"m","input":"x","max_output_tokens":-1}`, ErrRange},
		{"store of a string", `{"model":"m","input":"x","store":"no"}`, ErrType},
		{"trailing bytes", `{"model":"m","input":"x"} x`, ErrMalformed},
		{"items past the limit", many(`{"model":"m","input":[`, `{"role":"user","content":"x"}`, `]}`, 3), ErrTooManyMessages},
		{"tools past the limit", many(`{"model":"m","input":"x","tools":[`, weatherTool, `]}`, 3), ErrTooManyTools},
		{"parts past the limit", many(`{"model":"m","input":[{"role":"user","content":[`, `{"type":"input_text","text":"x"}`, `]}]}`, 3), ErrTooManyParts},
		{"nested too deep", `{"model":"m","input":"x","tools":[{"type":"function","name":"f","parameters":` + strings.Repeat("[", 10) + strings.Repeat("]", 10) + `}]}`, ErrTooDeep},
	}
	lim := Limits{Messages: 2, Tools: 2, Parts: 2, Depth: 8}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := lim.ParseResponses([]byte(tc.body))
			if !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}

// TestResponsesHashLikeChat: a Responses request and the chat request an
// engine renders it as (same instructions as system prompt, same tool
// schema, same turns) hash to the same blocks, and a Responses request
// with other input still shares the system prompt and tools.
func TestResponsesHashLikeChat(t *testing.T) {
	sys := longText(1, 600)
	resp := `{"model":"m","instructions":"` + sys + `","tools":[` + weatherTool + `],"tool_choice":"auto","input":[{"role":"user","content":"Weather in Paris?"}]}`
	chat := `{"model":"m","tools":[` + weatherChatTool + `],"messages":[{"role":"system","content":"` + sys + `"},{"role":"user","content":"Weather in Paris?"}]}`
	rp, _, err := Limits{}.ParseResponses([]byte(resp))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := Text{}.Hashes(rp, nil)
	b := hashes(t, Text{}, chat)
	if d := cmp.Diff(b, a); d != "" {
		t.Errorf("responses hashes differ from chat's (-chat +responses):\n%s", d)
	}
	other, _, err := Limits{}.ParseResponses([]byte(strings.Replace(resp, "Paris", "Rome", 1)))
	if err != nil {
		t.Fatal(err)
	}
	c, _ := Text{}.Hashes(other, nil)
	shared := 0
	for shared < min(len(a), len(c)) && a[shared] == c[shared] {
		shared++
	}
	if want := (len(sys) + len(weatherChatTool)) / 64; shared < want {
		t.Errorf("another question shares %d blocks, want at least %d (system prompt and tools)", shared, want)
	}
}

// FuzzParseResponses: any body parses or fails with an error, never
// panics, and a parsed prompt stays within the limits.
func FuzzParseResponses(f *testing.F) {
	f.Add([]byte(`{"model":"m","input":"hi"}`))
	f.Add([]byte(`{"model":"m","instructions":"s","tools":[` + weatherTool + `],"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"},{"role":"user","content":[{"type":"input_text","text":"x"}]}],"previous_response_id":"r","store":null}`))
	f.Add([]byte(`{"model":"m","input":[{"role":"assistant","content":null},{"type":"function_call"}],"tool_choice":{"type":"function"}}`))
	lim := Limits{Messages: 8, Tools: 4, Parts: 8, Depth: 12}
	f.Fuzz(func(t *testing.T, body []byte) {
		p, _, err := lim.ParseResponses(body)
		if err != nil {
			return
		}
		if p.Model == "" {
			t.Fatal("parsed without a model")
		}
		if len(p.Messages) > lim.Messages+1 { // +1: instructions
			t.Fatalf("%d messages past the limit %d", len(p.Messages), lim.Messages)
		}
		Text{}.Hashes(p, nil)
	})
}

// TestChatToolChoiceNotRendered: a chat request's tool_choice and
// response_format are not in the prompt (vLLM renders a chat request's
// tools whatever its tool_choice, and applies response_format to
// decoding), so requests that differ only in them hash the same.
func TestChatToolChoiceNotRendered(t *testing.T) {
	base := `{"model":"m","tools":[` + weatherChatTool + `],"messages":[{"role":"system","content":"` + longText(1, 300) + `"},{"role":"user","content":"w?"}]`
	want := hashes(t, Text{}, base+`}`)
	for _, extra := range []string{
		`,"tool_choice":"none"`, `,"tool_choice":"required"`,
		`,"tool_choice":{"type":"function","function":{"name":"get_weather"}}`,
		`,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}}`,
	} {
		if got := hashes(t, Text{}, base+extra+`}`); !cmp.Equal(got, want) {
			t.Errorf("%s changes the hashes", extra)
		}
	}
}

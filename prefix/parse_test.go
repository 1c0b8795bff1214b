package prefix

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		body string
		want Prompt
	}{
		{"chat", `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":7,"user":"u1"}`,
			Prompt{Model: "m", Chat: true, Messages: []Message{{Role: "system", Content: "s"}, {Role: "user", Content: "hi"}}, Stream: true, IncludeUsage: true,
				StreamOptionsAt: [2]int{120, 142}, IncludeUsageAt: [2]int{137, 141}, MaxTokens: 7, User: "u1"}},
		{"stream_options null", `{"model":"m","prompt":"p","stream_options": null }`, Prompt{Model: "m", Prompts: []string{"p"}, StreamOptionsAt: [2]int{44, 48}}},
		{"content parts", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}`,
			Prompt{Model: "m", Chat: true, Messages: []Message{{Role: "user", Content: "a\nb"}}}},
		{"image part kept raw", `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`,
			Prompt{Model: "m", Chat: true, Messages: []Message{{Role: "user", Content: `{"type":"image_url","image_url":{"url":"x"}}`}}}},
		{"null content with tool calls", `{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1"}]},{"role":"tool","tool_call_id":"c1","content":"42"}]}`,
			Prompt{Model: "m", Chat: true, Messages: []Message{{Role: "assistant", ToolCalls: json.RawMessage(`[{"id":"c1"}]`)}, {Role: "tool", ToolCallID: "c1", Content: "42"}}}},
		{"max_completion_tokens wins", `{"model":"m","prompt":"p","max_tokens":3,"max_completion_tokens":9}`,
			Prompt{Model: "m", Prompts: []string{"p"}, MaxTokens: 9}},
		{"prompt strings", `{"model":"m","prompt":["a","b"]}`, Prompt{Model: "m", Prompts: []string{"a", "b"}}},
		{"prompt ids", `{"model":"m","prompt":[1,2,3]}`, Prompt{Model: "m", PromptIDs: [][]uint32{{1, 2, 3}}}},
		{"prompt id batch", `{"model":"m","prompt":[[1],[2,3]]}`, Prompt{Model: "m", PromptIDs: [][]uint32{{1}, {2, 3}}}},
		{"tools raw", `{"model":"m","tools":[{"type":"function"}],"messages":[{"role":"user","content":"x"}]}`,
			Prompt{Model: "m", Chat: true, Tools: json.RawMessage(`[{"type":"function"}]`), Messages: []Message{{Role: "user", Content: "x"}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse([]byte(tc.body))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tc.want, *got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, body string
		want       error
	}{
		{"not json", `{"model":`, ErrMalformed},
		{"not an object", `[1,2]`, ErrMalformed},
		{"empty", ``, ErrMalformed},
		{"missing model", `{"messages":[{"role":"user","content":"x"}]}`, ErrNoModel},
		{"model not a string", `{"model":3,"prompt":"x"}`, ErrMalformed},
		{"neither", `{"model":"m"}`, ErrNoPrompt},
		{"null prompt", `{"model":"m","prompt":null}`, ErrNoPrompt},
		{"empty messages", `{"model":"m","messages":[]}`, ErrNoPrompt},
		{"bad content", `{"model":"m","messages":[{"role":"user","content":5}]}`, ErrMalformed},
		{"bad part", `{"model":"m","messages":[{"role":"user","content":[5]}]}`, ErrMalformed},
		{"bad prompt", `{"model":"m","prompt":{"a":1}}`, ErrMalformed},
		{"empty prompt array", `{"model":"m","prompt":[]}`, ErrMalformed},
		{"negative ids", `{"model":"m","prompt":[-1]}`, ErrMalformed},
		{"negative max_tokens", `{"model":"m","prompt":"x","max_tokens":-1}`, ErrMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Parse([]byte(tc.body))
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v (%+v), want %v", err, p, tc.want)
			}
		})
	}
}

func TestKeys(t *testing.T) {
	long := longText(9, 300)
	base := mustParse(t, `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"`+long+`"}]}`)
	tests := []struct {
		name                 string
		body                 string
		samePrefix, sameConv bool
	}{
		{"later turn", `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"` + long + `"},{"role":"assistant","content":"a"},{"role":"user","content":"q"}]}`, true, true},
		{"differs after 100 chars", `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"` + long[:100] + `zzz"}]}`, true, false},
		{"other system prompt", `{"model":"m","messages":[{"role":"system","content":"t"},{"role":"user","content":"` + long + `"}]}`, true, false},
		{"other model", `{"model":"n","messages":[{"role":"system","content":"s"},{"role":"user","content":"` + long + `"}]}`, false, false},
		{"completions with the same text", `{"model":"m","prompt":"` + long + `"}`, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := mustParse(t, tc.body)
			if got := p.PrefixKey() == base.PrefixKey(); got != tc.samePrefix {
				t.Errorf("same PrefixKey = %v, want %v", got, tc.samePrefix)
			}
			if got := p.ConversationKey() == base.ConversationKey(); got != tc.sameConv {
				t.Errorf("same ConversationKey = %v, want %v", got, tc.sameConv)
			}
			if p.ConversationKey() == 0 {
				t.Error("ConversationKey is zero")
			}
		})
	}
	if got := firstRunes("日本語", 2); got != "日本" {
		t.Errorf("firstRunes = %q, want 日本", got)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`,
		`{"model":"m","prompt":[[1,2],[3]]}`,
		`{"model":"m","prompt":"x","tools":[1],"max_tokens":3}`,
		`{"model":`, `null`, `[]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := Parse(body)
		if err != nil {
			if p != nil {
				t.Fatal("a prompt returned with an error")
			}
			return
		}
		if p.Model == "" {
			t.Fatal("parsed without a model")
		}
		h1, tok := Text{ChunkChars: 8}.Hashes(p, nil)
		h2, _ := Text{ChunkChars: 8}.Hashes(p, nil)
		if !cmp.Equal(h1, h2) || tok < 0 {
			t.Fatalf("hashing is not deterministic or tokens negative: %d", tok)
		}
		p.PrefixKey()
		p.ConversationKey()
	})
}

// chatBody32k is chat32k as a streaming chat request body.
func chatBody32k(tb testing.TB) []byte {
	p := chat32k()
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var w struct {
		Model    string `json:"model"`
		Messages []msg  `json:"messages"`
		Stream   bool   `json:"stream"`
	}
	w.Model, w.Stream = p.Model, true
	for _, m := range p.Messages {
		w.Messages = append(w.Messages, msg{m.Role, m.Content})
	}
	body, err := json.Marshal(w)
	if err != nil {
		tb.Fatal(err)
	}
	return body
}

// BenchmarkParse measures Parse of a 32,000-character chat body.
//
//	go test -run='^$' -bench=BenchmarkParse -benchmem ./prefix
func BenchmarkParse(b *testing.B) {
	body := chatBody32k(b)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := Parse(body); err != nil {
			b.Fatal(err)
		}
	}
}

func TestFieldErrors(t *testing.T) {
	for _, tc := range []struct {
		body, field string
		want        error // ErrType, ErrRange, or nil: a syntax error, no field
	}{
		{`{"model":`, "", nil},
		{`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":`, "", nil},
		{`{"model":3}`, "model", ErrType},
		{`{"model":"m","messages":"hi"}`, "messages", ErrType},
		{`{"model":"m","messages":[{"role":"user","content":3}]}`, "messages", ErrType},
		{`{"model":"m","prompt":3}`, "prompt", ErrType},
		{`{"model":"m","prompt":"a","stream":"yes"}`, "stream", ErrType},
		{`{"model":"m","prompt":"a","max_tokens":-5}`, "max_tokens", ErrRange},
		{`{"model":"m","prompt":"a","max_completion_tokens":-1}`, "max_completion_tokens", ErrRange},
	} {
		_, err := Parse([]byte(tc.body))
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: got %v, want ErrMalformed", tc.body, err)
			continue
		}
		var fe *FieldError
		got := ""
		if errors.As(err, &fe) {
			got = fe.Field
		}
		if got != tc.field {
			t.Errorf("%s: field %q, want %q (%v)", tc.body, got, tc.field, err)
		}
		for _, e := range []error{ErrType, ErrRange} {
			if errors.Is(err, e) != (e == tc.want) {
				t.Errorf("%s: errors.Is(%v) = %v (%v)", tc.body, e, errors.Is(err, e), err)
			}
		}
	}
}

package prefix

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
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

// parseStd is the encoding/json Parse this package had before its scanner:
// the oracle of TestParseMatchesStd and FuzzParseMatchesStd.
func parseStd(body []byte) (*Prompt, error) {
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
		if err := parsePromptStd(w.Prompt, p); err != nil {
			return nil, fmt.Errorf("%w: prompt: %v", ErrMalformed, err)
		}
	default:
		return nil, ErrNoPrompt
	}
	return p, nil
}

// parsePrompt decodes a completions prompt: a string, an array of strings,
// an array of token ids, or an array of arrays of token ids.
func parsePromptStd(raw json.RawMessage, p *Prompt) error {
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

// normalize maps the documented differences of Parse from parseStd away:
// parseStd keeps a null "tools" or "tool_calls" as the JSON null.
func normalize(p *Prompt) {
	if string(p.Tools) == "null" {
		p.Tools = nil
	}
	for i := range p.Messages {
		if string(p.Messages[i].ToolCalls) == "null" {
			p.Messages[i].ToolCalls = nil
		}
	}
}

// errClass names the sentinel err wraps.
func errClass(err error) string {
	for _, e := range []error{ErrMalformed, ErrNoModel, ErrNoPrompt} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	if err != nil {
		return "other: " + err.Error()
	}
	return ""
}

// checkSame fails if Parse and parseStd disagree on body.
func checkSame(t *testing.T, body []byte) {
	t.Helper()
	got, gotErr := NoLimits().Parse(body)
	want, wantErr := parseStd(body)
	if errClass(gotErr) != errClass(wantErr) {
		t.Fatalf("%q: Parse error %v, encoding/json %v", body, gotErr, wantErr)
	}
	if gotErr != nil {
		return
	}
	normalize(want)
	// The byte ranges are checked against the body, then left out.
	so, iu := got.StreamOptionsAt, got.IncludeUsageAt
	if so != [2]int{} && !json.Valid(body[so[0]:so[1]]) ||
		iu != [2]int{} && (iu[0] < so[0] || iu[1] > so[1] || !slices.Contains([]string{"true", "false", "null"}, string(body[iu[0]:iu[1]]))) ||
		got.IncludeUsage != (iu != [2]int{} && string(body[iu[0]:iu[1]]) == "true") {
		t.Fatalf("%q: stream_options at %v, include_usage at %v", body, so, iu)
	}
	got.StreamOptionsAt, got.IncludeUsageAt = [2]int{}, [2]int{}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("%q: (-encoding/json +Parse):\n%s", body, diff)
	}
}

func TestParseMatchesStd(t *testing.T) {
	for _, body := range []string{
		`{"model":"m","messages":[{"role":"user","content":"a\"b\\c\/d\b\f\n\r\te"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"\u00e9\u65e5\ud83d\ude42 \ud83d x \ude42 \ud83d\u0041"}]}`,
		"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"cafÃ© æ\u0097¥æ\u009c¬\"}]}",
		` {"model" : "m" , "messages" : [ { "role" : "user" , "content" : [ {"text":"t1","type":"text"} , {"type":"image_url","image_url":{"url":"u"}} ] } ] } ` + "\n",
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text"},{"type":"text","text":null},{"type":"text","text":"x","extra":[1,{"a":null}]}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"input_audio","text":"not text"}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":"x","name":"n","tool_call_id":"i","tool_calls":[{"id":"c","function":{"name":"f","arguments":"{}"}}],"unknown":{"deep":[[[]]]}}]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"messages":[{"role":"system","content":"y"}]}`,
		`{"model":"m","prompt":"p","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","prompt":{"bad":1},"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","messages":null,"prompt":"p"}`,
		`{"model":"m","prompt":"a\nb","max_tokens":null,"max_completion_tokens":5}`,
		`{"model":"m","prompt":[0,4294967295]}`,
		`{"model":"m","prompt":[4294967296]}`,
		`{"model":"m","prompt":[1.5]}`,
		`{"model":"m","prompt":[1e2]}`,
		`{"model":"m","prompt":[[],[1]]}`,
		`{"model":"m","prompt":["a",1]}`,
		`{"model":"m","prompt":[[1],"a"]}`,
		`{"model":"m","prompt":[1,[2]]}`,
		`{"model":"m","prompt":"x","max_tokens":1.0}`,
		`{"model":"m","prompt":"x","max_tokens":-0}`,
		`{"model":"m","prompt":"x","max_tokens":9223372036854775807}`,
		`{"model":"m","prompt":"x","max_tokens":9223372036854775808}`,
		`{"model":"m","prompt":"x","stream":"yes"}`,
		`{"model":"m","prompt":"x","stream_options":null,"stream":true}`,
		`{"model":"m","prompt":"x","stream_options":{"x":[1,2],"include_usage":true}}`,
		`{"model":"m","prompt":"x","stream_options":[]}`,
		`{"model":"m","prompt":"x","user":null,"tools":null}`,
		`{"model":"m","prompt":"x"} x`,
		"{}\x00",
		"{\"model\":\"m\",\"prompt\":\"x\"}\x00",
		`{"model":"m","prompt":"x",}`,
		`{"model":"m","prompt":"x" "user":"u"}`,
		`{"model":"m","prompt":"a` + "\x01" + `"}`,
		`{"model":"m","prompt":"a\x"}`,
		`{"model":"m","prompt":"a\u12"}`,
		`{"model":"m","prompt":"abc`,
		`{"model":"m","prompt":01}`,
		`{"model":"m","prompt":-}`,
		`{"model":"m","prompt":"x","t":tru}`,
		`{"model":"m","prompt":"x","n":[1.e5]}`,
		`{"model":"m","prompt":"x","n":[-0.5E+10, 1e-3, 0]}`,
		`{"model":"m","messages":[{"role":"user","content":[]}]}`,
		`{"model":"m","messages":[{"role":"user","content":{}}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":5}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"text":5}]}]}`,
		`{"model":"m","messages":[{"role":5}]}`,
		`{"model":"m","messages":[5]}`,
		`{"model":"m","messages":{}}`,
		`{"model":"","prompt":"x"}`,
		`{"model":null,"prompt":"x"}`,
		`{"mod\u0065l":"m","prompt":"x"}`,
		"{\"model\":\"m\",\"prompt\":\"" + strings.Repeat("long \\\"quoted\\\" text\\n", 500) + "\"}",
	} {
		checkSame(t, []byte(body))
	}
}

// FuzzParseMatchesStd checks Parse against encoding/json on bodies outside
// their documented differences (case-insensitive and escaped keys, invalid
// UTF-8, nulls inside prompt arrays).
func FuzzParseMatchesStd(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi\n\"x\""}],"stream":true}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image","x":[1,{}]}]}]}`,
		`{"model":"m","prompt":[[1,2],[3]],"max_completion_tokens":2,"max_tokens":1}`,
		`{"model":"m","prompt":["a","b\t"],"tools":[{"f":true}],"user":"u"}`,
		`{"model":"m","prompt":"x","stream_options":{"include_usage":false}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if !utf8.Valid(body) || bytes.Contains(body, []byte(`\u`)) || bytes.Contains(body, []byte("null")) ||
			bytes.ContainsFunc(body, func(r rune) bool { return r >= 'A' && r <= 'Z' || r >= utf8.RuneSelf }) {
			return
		}
		checkSame(t, body)
	})
}

// BenchmarkParseStd is BenchmarkParse for parseStd, the encoding/json
// version, for comparison.
func BenchmarkParseStd(b *testing.B) {
	body := chatBody32k(b)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := parseStd(body); err != nil {
			b.Fatal(err)
		}
	}
}

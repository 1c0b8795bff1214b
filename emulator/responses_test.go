package emulator

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

const weather = `{"type":"function","name":"get_weather","description":"Weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}`

// weatherChat is weather as a chat client sends it, with other spacing.
const weatherChat = `{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}`

// respObject is the part of a response object the tests read.
type respObject struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Status string `json:"status"`
	Output []struct {
		Type    string `json:"type"`
		Role    string `json:"role"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage struct {
		InputTokens        int `json:"input_tokens"`
		OutputTokens       int `json:"output_tokens"`
		InputTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
	} `json:"usage"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
}

func postResponse(t *testing.T, url, body string) respObject {
	t.Helper()
	status, out := post(t, url+"/v1/responses", body)
	if status != 200 {
		t.Fatalf("status %d: %s", status, out)
	}
	var r respObject
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("decode %s: %v", out, err)
	}
	return r
}

// TestResponsesChain: a chain of Responses requests (previous_response_id)
// finds the earlier turn's prompt and output in the engine's cache, and a
// chat request with the same system prompt and tool schema finds the
// Responses request's.
func TestResponsesChain(t *testing.T) {
	s := start(t, Config{})
	sys := words("sy", 200)
	r1 := postResponse(t, s.URL(), `{"model":"m","instructions":"`+sys+`","tools":[`+weather+`],"input":"Weather in Paris?","max_output_tokens":8}`)
	if r1.Object != "response" || r1.Status != "incomplete" || r1.IncompleteDetails == nil || r1.IncompleteDetails.Reason != "max_output_tokens" {
		t.Errorf("first response: object %q status %q incomplete %+v, want response, incomplete for max_output_tokens", r1.Object, r1.Status, r1.IncompleteDetails)
	}
	if len(r1.Output) != 1 || r1.Output[0].Type != "message" || len(r1.Output[0].Content) != 1 || r1.Output[0].Content[0].Type != "output_text" {
		t.Fatalf("output %+v, want one message with one output_text", r1.Output)
	}
	if r1.Usage.OutputTokens != 8 {
		t.Errorf("output tokens %d, want 8", r1.Usage.OutputTokens)
	}
	r2 := postResponse(t, s.URL(), `{"model":"m","instructions":"`+sys+`","tools":[`+weather+`],"previous_response_id":"`+r1.ID+`","input":[{"role":"user","content":[{"type":"input_text","text":"And Rome?"}]}]}`)
	if r2.Usage.InputTokensDetails.CachedTokens < r1.Usage.InputTokens-16 {
		t.Errorf("follow-up cached %d tokens, want the first turn's %d but its last partial block", r2.Usage.InputTokensDetails.CachedTokens, r1.Usage.InputTokens)
	}
	chat := `{"model":"m","tools":[` + weatherChat + `],"messages":[{"role":"system","content":"` + sys + `"},{"role":"user","content":"Weather in Oslo?"}]}`
	status, out := post(t, s.URL()+"/v1/chat/completions", chat)
	if status != 200 {
		t.Fatalf("chat: status %d: %s", status, out)
	}
	c := decodeResponse(t, out)
	if got, want := c.Usage.PromptTokensDetails.CachedTokens, CountTokens(sys)+16; got < want {
		t.Errorf("chat with the same system prompt and tool schema cached %d tokens, want at least %d", got, want)
	}
	status, out = post(t, s.URL()+"/v1/responses", `{"model":"m","previous_response_id":"resp_nope","input":"x"}`)
	if status != http.StatusNotFound || !strings.Contains(decodeError(t, out).Message, "resp_nope") {
		t.Errorf("unknown previous_response_id: status %d %s, want 404 naming it", status, out)
	}
	r3 := postResponse(t, s.URL(), `{"model":"m","input":"x","store":false}`)
	if status, _ := post(t, s.URL()+"/v1/responses", `{"model":"m","previous_response_id":"`+r3.ID+`","input":"y"}`); status != http.StatusNotFound {
		t.Errorf("continuing a response not stored: status %d, want 404", status)
	}
}

// TestResponsesStream: the stream's events are OpenAI's, in order, each
// with "event:" naming its data's type, and the deltas add up to the text.
func TestResponsesStream(t *testing.T) {
	s := start(t, Config{})
	resp, err := http.Post(s.URL()+"/v1/responses", "application/json", strings.NewReader(`{"model":"m","input":"hi","stream":true,"max_output_tokens":5}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var types []string
	var deltas, done string
	var completed respObject
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		name, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "event: ")
		if !ok {
			t.Fatalf("line %q, want an event: line", line)
		}
		data, _ := r.ReadString('\n')
		blank, _ := r.ReadString('\n')
		payload, ok := strings.CutPrefix(strings.TrimSuffix(data, "\n"), "data: ")
		if !ok || blank != "\n" {
			t.Fatalf("event %s: data %q then %q, want a data line and a blank line", name, data, blank)
		}
		var ev struct {
			Type     string          `json:"type"`
			Seq      int             `json:"sequence_number"`
			Delta    string          `json:"delta"`
			Text     string          `json:"text"`
			Response json.RawMessage `json:"response"`
		}
		if err := json.Unmarshal([]byte(payload), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Type != name || ev.Seq != len(types) {
			t.Errorf("event %s: type %q sequence %d, want %s and %d", name, ev.Type, ev.Seq, name, len(types))
		}
		types = append(types, name)
		switch name {
		case "response.output_text.delta":
			deltas += ev.Delta
		case "response.output_text.done":
			done = ev.Text
		case "response.incomplete", "response.completed":
			json.Unmarshal(ev.Response, &completed)
		}
	}
	want := []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"}
	if len(types) < len(want)+5 {
		t.Fatalf("events %v", types)
	}
	for i, w := range want {
		if types[i] != w {
			t.Errorf("event %d: %s, want %s", i, types[i], w)
		}
	}
	tail := []string{"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"}
	for i, w := range tail {
		if got := types[len(types)-len(tail)+i]; got != w {
			t.Errorf("event %d from the end: %s, want %s", len(tail)-i, got, w)
		}
	}
	if deltas == "" || deltas != done || completed.Output[0].Content[0].Text != done || completed.Usage.OutputTokens != 5 {
		t.Errorf("deltas %q, done %q, final %+v: want equal texts of 5 tokens", deltas, done, completed)
	}
}

// TestStop: the output ends before the first stop string, with finish
// reason stop, streaming or not.
func TestStop(t *testing.T) {
	s := start(t, Config{})
	body := map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": "hi"}}, "stop": []string{" mat", "zzz"}, "max_tokens": 30}
	status, out := post(t, s.URL()+"/v1/chat/completions", body)
	if status != 200 {
		t.Fatalf("status %d: %s", status, out)
	}
	r := decodeResponse(t, out)
	if got := r.Choices[0].Message.Content; got != "The cat sat on a" || *r.Choices[0].FinishReason != "stop" || r.Usage.CompletionTokens != 6 {
		t.Errorf("got %q, %s, %d tokens; want \"The cat sat on a\", stop, 6", got, *r.Choices[0].FinishReason, r.Usage.CompletionTokens)
	}
	body["stream"] = true
	st := streamPost(t, s.URL()+"/v1/chat/completions", body)
	var text string
	for _, ev := range st.events {
		var c struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(ev), &c) == nil && len(c.Choices) > 0 {
			text += c.Choices[0].Delta.Content
		}
	}
	if text != "The cat sat on a" {
		t.Errorf("streamed %q, want %q", text, "The cat sat on a")
	}
	if status, _ := post(t, s.URL()+"/v1/completions", `{"model":"m","prompt":"x","stop":[""]}`); status != 400 {
		t.Errorf("an empty stop string: status %d, want 400", status)
	}
}

// TestEmbeddings: one unit vector per input, of the dimensions asked,
// equal for equal inputs; prompt tokens counted; bad requests are 400s.
func TestEmbeddings(t *testing.T) {
	s := start(t, Config{})
	status, out := post(t, s.URL()+"/v1/embeddings", `{"model":"m","input":["hello there","other","hello there"],"dimensions":8}`)
	if status != 200 {
		t.Fatalf("status %d: %s", status, out)
	}
	var r struct {
		Data []struct {
			Index     int       `json:"index"`
			Embedding []float64 `json:"embedding"`
		} `json:"data"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Data) != 3 || len(r.Data[0].Embedding) != 8 || r.Data[2].Index != 2 {
		t.Fatalf("got %s", out)
	}
	norm := 0.0
	for _, x := range r.Data[0].Embedding {
		norm += x * x
	}
	if norm < 0.99 || norm > 1.01 {
		t.Errorf("squared norm %g, want 1", norm)
	}
	a, _ := json.Marshal(r.Data[0].Embedding)
	b, _ := json.Marshal(r.Data[2].Embedding)
	c, _ := json.Marshal(r.Data[1].Embedding)
	if !bytes.Equal(a, b) || bytes.Equal(a, c) {
		t.Errorf("equal inputs gave %s and %s, another %s", a, b, c)
	}
	if want := 2*CountTokens("hello there") + CountTokens("other"); r.Usage.PromptTokens != want {
		t.Errorf("prompt tokens %d, want %d", r.Usage.PromptTokens, want)
	}
	for _, bad := range []string{`{"model":"m","input":[]}`, `{"model":"m","input":{}}`, `{"model":"m","input":"x","dimensions":0}`, `{"model":"m","input":"x","encoding_format":"hex"}`} {
		if status, _ := post(t, s.URL()+"/v1/embeddings", bad); status != 400 {
			t.Errorf("%s: status %d, want 400", bad, status)
		}
	}
}

// TestChoices: n > 1 answers n choices by index, the prompt counted once
// and the output of all, streamed (each chunk with its choice's index)
// or not.
func TestChoices(t *testing.T) {
	s := start(t, Config{})
	body := map[string]any{"model": "m", "messages": []map[string]string{{"role": "user", "content": "hi"}}, "n": 3, "max_tokens": 4}
	status, out := post(t, s.URL()+"/v1/chat/completions", body)
	if status != 200 {
		t.Fatalf("status %d: %s", status, out)
	}
	r := decodeResponse(t, out)
	one := CountTokens(RenderChat([]Message{{Role: "user", Content: "hi"}}, true))
	if len(r.Choices) != 3 || r.Usage.CompletionTokens != 12 || r.Usage.PromptTokens != one {
		t.Fatalf("got %d choices, usage %+v; want 3, 12 completion tokens, %d prompt tokens", len(r.Choices), *r.Usage, one)
	}
	for i, c := range r.Choices {
		if c.Index != i || c.Message.Content != "The cat sat on" {
			t.Errorf("choice %d: index %d text %q", i, c.Index, c.Message.Content)
		}
	}
	body["stream"] = true
	body["stream_options"] = map[string]bool{"include_usage": true}
	st := streamPost(t, s.URL()+"/v1/chat/completions", body)
	texts := map[int]string{}
	for _, ev := range st.events {
		var c struct {
			Choices []struct {
				Index int `json:"index"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if json.Unmarshal([]byte(ev), &c) == nil && len(c.Choices) > 0 {
			texts[c.Choices[0].Index] += c.Choices[0].Delta.Content
		}
	}
	if len(texts) != 3 || texts[2] != "The cat sat on" || st.events[len(st.events)-1] != "[DONE]" {
		t.Errorf("streamed texts %v, want 3 of \"The cat sat on\" then [DONE]", texts)
	}
}

package emulator

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/engine"
)

// The Responses API (POST /v1/responses), as vLLM serves it
// (vllm/entrypoints/openai/serving_responses.py): the request becomes chat
// messages, rendered through the chat template like a chat request:
// "instructions" is a leading system message; with "previous_response_id",
// the stored messages of the response continued (its system message left
// out: instructions do not carry over) and its output text as an assistant
// message come next; then "input", a string (a user message) or items
// (messages; function_call items as assistant tool calls, joining the
// assistant message before them; function_call_output items as tool
// messages; others dropped). Function tools render as their chat form
// (tools.go); "tool_choice": "none" renders none. Responses are kept (unless
// "store": false) for later requests to continue, the oldest dropped past
// maxStoredResponses. Events of a stream are OpenAI's: response.created,
// response.in_progress, response.output_item.added,
// response.content_part.added, response.output_text.delta...,
// response.output_text.done, response.content_part.done,
// response.output_item.done, then response.completed (or
// response.incomplete when max_output_tokens ended it).

// maxStoredResponses bounds the responses kept for previous_response_id.
const maxStoredResponses = 4096

// responsesRequest is the body of POST /v1/responses.
type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       string          `json:"instructions"`
	Tools              []responseTool  `json:"tools"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	PreviousResponseID string          `json:"previous_response_id"`
	Store              *bool           `json:"store"`
	Stream             bool            `json:"stream"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Text               json.RawMessage `json:"text"`
	User               string          `json:"user"`
}

// responseTool is a Responses API tool: flat, a function's fields at the
// top level.
type responseTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description *string         `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

// inputItem is one item of "input".
type inputItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// storedResponse is what a later request continuing a response needs.
type storedResponse struct {
	messages []Message // the request's messages, system ones left out
	output   string    // the response's output text
}

// responseStore keeps responses for previous_response_id; mu guards all.
type responseStore struct {
	mu    sync.Mutex
	byID  map[string]storedResponse
	order []string // ids, oldest first
}

func (st *responseStore) get(id string) (storedResponse, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	r, ok := st.byID[id]
	return r, ok
}

func (st *responseStore) put(id string, r storedResponse) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.byID == nil {
		st.byID = map[string]storedResponse{}
	}
	if len(st.order) >= maxStoredResponses {
		delete(st.byID, st.order[0])
		st.order = st.order[1:]
	}
	st.byID[id] = r
	st.order = append(st.order, id)
}

// partsText flattens content (a string, null, or parts) to its text: the
// text of input_text, output_text and text parts, joined with "\n".
func partsText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("content must be a string or an array of parts")
	}
	var texts []string
	for _, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text":
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// inputMessages converts "input" to chat messages.
func inputMessages(raw json.RawMessage) ([]Message, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []Message{{Role: "user", Content: s}}, nil
	}
	var items []inputItem
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, errors.New("input must be a string or an array of items")
	}
	var out []Message
	for i, it := range items {
		switch it.Type {
		case "", "message":
			text, err := partsText(it.Content)
			if err != nil {
				return nil, fmt.Errorf("input[%d]: %w", i, err)
			}
			if it.Role == "" {
				return nil, fmt.Errorf("input[%d].role is required", i)
			}
			out = append(out, Message{Role: it.Role, Content: text})
		case "function_call":
			call, err := renderCalls(mustCalls(it))
			if err != nil {
				return nil, fmt.Errorf("input[%d]: %w", i, err)
			}
			if n := len(out); n > 0 && out[n-1].Role == "assistant" {
				out[n-1].ToolCalls += call
				continue
			}
			out = append(out, Message{Role: "assistant", ToolCalls: call})
		case "function_call_output":
			text, err := partsText(it.Output)
			if err != nil {
				return nil, fmt.Errorf("input[%d].output: %w", i, err)
			}
			out = append(out, Message{Role: "tool", Content: text})
		}
	}
	return out, nil
}

// mustCalls is a function_call item as a chat tool_calls array.
func mustCalls(it inputItem) json.RawMessage {
	var c toolCall
	c.ID, c.Type = it.CallID, "function"
	c.Function.Name, c.Function.Arguments = it.Name, it.Arguments
	b, _ := json.Marshal([]toolCall{c}) // strings only: cannot fail
	return b
}

// chatTools converts the function tools to their chat form; none when
// tool_choice is "none".
func (req *responsesRequest) chatTools() []chatTool {
	var choice string
	if json.Unmarshal(req.ToolChoice, &choice) == nil && choice == "none" {
		return nil
	}
	var out []chatTool
	for _, t := range req.Tools {
		if t.Type == "function" {
			out = append(out, chatTool{Type: "function", Function: toolFunction{Name: t.Name, Description: t.Description, Parameters: t.Parameters}})
		}
	}
	return out
}

// messages builds the request's chat messages (see the package notes).
func (s *Server) responseMessages(req *responsesRequest) (all, own []Message, err error) {
	if req.Instructions != "" {
		all = append(all, Message{Role: "system", Content: req.Instructions})
	}
	if req.PreviousResponseID != "" {
		prev, ok := s.responses.get(req.PreviousResponseID)
		if !ok {
			return nil, nil, &httpError{status: http.StatusNotFound,
				msg: fmt.Sprintf("Response with id '%s' not found.", req.PreviousResponseID)}
		}
		all = append(all, prev.messages...)
		all = append(all, Message{Role: "assistant", Content: prev.output})
	}
	if len(req.Input) > 0 && string(req.Input) != "null" {
		in, err := inputMessages(req.Input)
		if err != nil {
			return nil, nil, badRequest("%v", err)
		}
		all = append(all, in...)
	}
	if len(all) == 0 {
		return nil, nil, badRequest("input is required")
	}
	for _, m := range all {
		if m.Role != "system" {
			own = append(own, m)
		}
	}
	return all, own, nil
}

// responses serves POST /v1/responses.
func (s *Server) responsesAPI(w http.ResponseWriter, r *http.Request) {
	var req responsesRequest
	sm, ok := s.request(w, r, &req, &req.Model)
	if !ok {
		return
	}
	msgs, own, err := s.responseMessages(&req)
	if err != nil {
		fail(w, err)
		return
	}
	tools, err := renderTools(req.chatTools())
	if err != nil {
		fail(w, badRequest("%v", err))
		return
	}
	text := RenderChatTools(msgs, tools, true)
	j := &job{id: s.newID("resp_"), model: sm.name, lora: sm.lora, tokens: Tokenize(text), stream: req.Stream, chat: true}
	if err := s.limits(j, req.MaxOutputTokens, nil); err != nil {
		fail(w, err)
		return
	}
	rs := &responseRun{s: s, req: &req, j: j, msgID: "msg_" + strings.TrimPrefix(j.id, "resp_"), created: time.Now().Unix()}
	f, ok := s.start(w, r, j)
	if !ok {
		return
	}
	var final engine.Event
	if req.Stream {
		final, err = rs.stream(w, r, f)
	} else {
		final, err = s.wait(r.Context(), f, nil)
		if err != nil && r.Context().Err() == nil {
			writeError(w, http.StatusServiceUnavailable, err.Error())
		}
		if err == nil {
			s.done(r, final)
			writeJSON(w, rs.object(final, true))
		}
	}
	if err == nil && (req.Store == nil || *req.Store) {
		s.responses.put(j.id, storedResponse{messages: own, output: rs.text(final)})
	}
}

// responseRun is one Responses request being answered.
type responseRun struct {
	s       *Server
	req     *responsesRequest
	j       *job
	msgID   string
	created int64
	seq     int
}

// text is the output text of final.
func (rs *responseRun) text(final engine.Event) string {
	return filler(0, final.OutputTokens, true)
}

// object is the response object: in progress (no output yet) or done.
func (rs *responseRun) object(final engine.Event, done bool) map[string]any {
	status := "in_progress"
	var output []any
	var usage, incomplete any
	if done {
		status = "completed"
		if rs.s.finishReason(rs.j, final) == "length" {
			status, incomplete = "incomplete", map[string]string{"reason": "max_output_tokens"}
		}
		output = []any{rs.message(rs.text(final), "completed")}
		usage = map[string]any{
			"input_tokens":          final.PromptTokens,
			"input_tokens_details":  map[string]int{"cached_tokens": final.CachedTokens},
			"output_tokens":         final.OutputTokens,
			"output_tokens_details": map[string]int{"reasoning_tokens": 0},
			"total_tokens":          final.PromptTokens + final.OutputTokens,
		}
	}
	if output == nil {
		output = []any{}
	}
	var prev any
	if rs.req.PreviousResponseID != "" {
		prev = rs.req.PreviousResponseID
	}
	tools := any(rs.req.Tools)
	if rs.req.Tools == nil {
		tools = []any{}
	}
	return map[string]any{
		"id": rs.j.id, "object": "response", "created_at": rs.created, "status": status, "model": rs.j.model,
		"output": output, "usage": usage, "incomplete_details": incomplete, "error": nil,
		"previous_response_id": prev, "instructions": nullIfEmpty(rs.req.Instructions), "tools": tools,
		"tool_choice": "auto", "parallel_tool_calls": true, "store": rs.req.Store == nil || *rs.req.Store,
		"max_output_tokens": rs.req.MaxOutputTokens, "temperature": 1.0, "top_p": 1.0, "truncation": "disabled",
		"text": map[string]any{"format": map[string]string{"type": "text"}}, "metadata": map[string]string{},
	}
}

// nullIfEmpty is s, or nil (JSON null) when empty.
func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// message is the output message item.
func (rs *responseRun) message(text, status string) map[string]any {
	content := []any{}
	if status == "completed" {
		content = []any{rs.part(text)}
	}
	return map[string]any{"id": rs.msgID, "type": "message", "status": status, "role": "assistant", "content": content}
}

// part is the output_text content part.
func (rs *responseRun) part(text string) map[string]any {
	return map[string]any{"type": "output_text", "text": text, "annotations": []any{}}
}

// event writes one stream event: "event: {type}" and its data, the
// event's type and sequence number added to fields.
func (rs *responseRun) event(out *sse, typ string, fields map[string]any) error {
	fields["type"], fields["sequence_number"] = typ, rs.seq
	rs.seq++
	b, err := json.Marshal(fields)
	if err != nil {
		return err
	}
	if _, err := out.w.Write([]byte("event: " + typ + "\n")); err != nil {
		return err
	}
	return out.raw(b)
}

// stream answers as a stream of Responses events while the engine runs.
func (rs *responseRun) stream(w http.ResponseWriter, r *http.Request, f *flight) (engine.Event, error) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	out := &sse{w: w, rc: http.NewResponseController(w)}
	at := map[string]any{"item_id": rs.msgID, "output_index": 0, "content_index": 0}
	with := func(k string, v any) map[string]any {
		m := map[string]any{k: v}
		for key, val := range at {
			m[key] = val
		}
		return m
	}
	open := []struct {
		typ    string
		fields map[string]any
	}{
		{"response.created", map[string]any{"response": rs.object(engine.Event{}, false)}},
		{"response.in_progress", map[string]any{"response": rs.object(engine.Event{}, false)}},
		{"response.output_item.added", map[string]any{"output_index": 0, "item": rs.message("", "in_progress")}},
		{"response.content_part.added", with("part", rs.part(""))},
	}
	for _, e := range open {
		if err := rs.event(out, e.typ, e.fields); err != nil {
			return engine.Event{}, err
		}
	}
	final, err := rs.s.wait(r.Context(), f, func(from, to int, done bool, _ engine.Event) error {
		if to <= from {
			return nil
		}
		d := with("delta", filler(from, to, true))
		d["logprobs"] = []any{}
		return rs.event(out, "response.output_text.delta", d)
	})
	if err != nil {
		return final, err
	}
	rs.s.done(r, final)
	text := rs.text(final)
	obj := rs.object(final, true)
	last := "response.completed"
	if obj["status"] == "incomplete" {
		last = "response.incomplete"
	}
	done := with("text", text)
	done["logprobs"] = []any{}
	closing := []struct {
		typ    string
		fields map[string]any
	}{
		{"response.output_text.done", done},
		{"response.content_part.done", with("part", rs.part(text))},
		{"response.output_item.done", map[string]any{"output_index": 0, "item": rs.message(text, "completed")}},
		{last, map[string]any{"response": obj}},
	}
	for _, e := range closing {
		if err := rs.event(out, e.typ, e.fields); err != nil {
			return final, err
		}
	}
	return final, nil
}

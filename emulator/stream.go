package emulator

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/kvrouter/kvrouter/engine"
)

// sse writes Server-Sent Events as vLLM does: "data: {json}\n\n" per chunk,
// "data: [DONE]\n\n" at the end, flushed after every write.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (e *sse) data(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return e.raw(b)
}

func (e *sse) raw(b []byte) error {
	buf := make([]byte, 0, len(b)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, b...)
	buf = append(buf, "\n\n"...)
	if _, err := e.w.Write(buf); err != nil {
		return err
	}
	return e.rc.Flush()
}

// chunkFactory builds the stream's chunks for one job.
type chunkFactory struct {
	j       *job
	model   string
	created int64
}

// role is the first chat chunk: the assistant role and empty content.
func (c chunkFactory) role() any {
	empty := ""
	return c.chat(chatChoice{Delta: &chatOut{Role: "assistant", Content: &empty}})
}

func (c chunkFactory) chat(ch chatChoice) chatResponse {
	return chatResponse{ID: c.j.id, Object: "chat.completion.chunk", Created: c.created, Model: c.model,
		Choices: []chatChoice{withIndex(ch, c.j.index)}, Usage: c.nullUsage()}
}

// nullUsage is the usage of a non-final chunk: null with include_usage,
// absent without.
func (c chunkFactory) nullUsage() any {
	if c.j.usage {
		return nullUsage
	}
	return nil
}

// token is the chunk of output token i; reason is set on the last one.
func (c chunkFactory) token(i int, reason *string) any {
	text := fillerWord(c.j.offset+i, c.j.chat)
	if c.j.stopped {
		text = c.j.clip(text, len(filler(c.j.offset, c.j.offset+i, c.j.chat)))
	}
	if c.j.chat {
		return c.chat(chatChoice{Delta: &chatOut{Content: &text}, FinishReason: reason})
	}
	return completionResponse{ID: c.j.id, Object: "text_completion", Created: c.created, Model: c.model,
		Choices: []completionChoice{{Index: c.j.index, Text: text, FinishReason: reason}}, Usage: c.nullUsage()}
}

// usage is the final chunk of a stream with include_usage: no choices.
func (c chunkFactory) usage(final engine.Event) any {
	if c.j.chat {
		return chatResponse{ID: c.j.id, Object: "chat.completion.chunk", Created: c.created, Model: c.model,
			Choices: []chatChoice{}, Usage: usageOf(final)}
	}
	return completionResponse{ID: c.j.id, Object: "text_completion", Created: c.created, Model: c.model,
		Choices: []completionChoice{}, Usage: usageOf(final)}
}

// stream answers j as SSE while the engine produces its tokens.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, j *job, f *flight) {
	out := startSSE(w)
	c := chunkFactory{j: j, model: j.model, created: time.Now().Unix()}
	final, err := s.streamChoice(r, out, c, f)
	if err != nil {
		return // the client is gone or the engine stopped: end the stream
	}
	s.done(r, final)
	s.endStream(out, c, final)
}

// startSSE answers 200 with an event stream.
func startSSE(w http.ResponseWriter) *sse {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	out := &sse{w: w, rc: http.NewResponseController(w)}
	out.rc.Flush()
	return out
}

// streamChoice sends the chunks of one choice (c.j) as the engine makes
// them and returns its Done event.
func (s *Server) streamChoice(r *http.Request, out *sse, c chunkFactory, f *flight) (engine.Event, error) {
	j := c.j
	return s.wait(r.Context(), f, func(from, to int, done bool, final engine.Event) error {
		if from == 0 && to > 0 && j.chat {
			if err := out.data(c.role()); err != nil {
				return err
			}
		}
		for i := from; i < to; i++ {
			var reason *string
			if done && i == to-1 {
				rs := s.finishReason(j, final)
				reason = &rs
			}
			if err := out.data(c.token(i, reason)); err != nil {
				return err
			}
		}
		return nil
	})
}

// endStream sends the usage chunk (with include_usage) and [DONE].
func (s *Server) endStream(out *sse, c chunkFactory, final engine.Event) {
	if c.j.usage {
		if err := out.data(c.usage(final)); err != nil {
			return
		}
	}
	out.raw([]byte("[DONE]"))
}

// tokenize answers POST /tokenize as vLLM does: {count, max_model_len,
// tokens, token_strs}; token_strs is null unless return_token_strs.
func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if err := s.decode(w, r, &req); err != nil {
		fail(w, err)
		return
	}
	if _, err := s.resolve(req.Model); err != nil {
		fail(w, err)
		return
	}
	var ids []uint32
	var strs []string
	switch {
	case req.Messages != nil:
		tools, err := renderTools(req.Tools)
		if err != nil {
			fail(w, badRequest("%v", err))
			return
		}
		text, err := renderWithTools(req.Messages, tools, req.AddGenerationPrompt == nil || *req.AddGenerationPrompt)
		if err != nil {
			fail(w, badRequest("%v", err))
			return
		}
		ids, strs = TokenizeStrs(text)
	case len(req.Prompt) > 0:
		var text string
		if err := json.Unmarshal(req.Prompt, &text); err != nil {
			fail(w, badRequest("prompt must be a string"))
			return
		}
		ids, strs = TokenizeStrs(text)
	default:
		fail(w, badRequest("either prompt or messages is required"))
		return
	}
	resp := struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []uint32 `json:"tokens"`
		TokenStrs   []string `json:"token_strs"`
	}{Count: len(ids), MaxModelLen: s.ecfg.MaxModelLen, Tokens: ids}
	if req.ReturnTokenStrs {
		resp.TokenStrs = strs
	}
	writeJSON(w, resp)
}

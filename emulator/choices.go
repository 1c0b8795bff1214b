package emulator

import (
	"fmt"
	"net/http"
	"time"

	"github.com/kvrouter/kvrouter/engine"
)

// Several choices ("n" > 1). vLLM samples them in parallel from one
// prefill; the emulator runs one engine request per choice, on the same
// prompt (the first computes it, the others find it cached or compute it
// alongside), and answers them as one response: choices by index, the
// prompt's usage counted once (the first choice's, with its cached
// tokens), the completion tokens of all. A stream sends each choice's
// chunks in turn, each with its index.

// maxChoices bounds "n".
const maxChoices = 64

// withIndex is ch as choice i.
func withIndex(ch chatChoice, i int) chatChoice {
	ch.Index = i
	return ch
}

// engineID is the engine request id of j: the response id, and for a
// choice past the first its index after it.
func (j *job) engineID() string {
	if j.index == 0 {
		return j.id
	}
	return fmt.Sprintf("%s-%d", j.id, j.index)
}

// serveChoices answers j's n choices.
func (s *Server) serveChoices(w http.ResponseWriter, r *http.Request, j *job) {
	if j.kv != nil {
		writeError(w, http.StatusBadRequest, "n > 1 cannot run with kv_transfer_params")
		return
	}
	jobs := make([]*job, j.n)
	flights := make([]*flight, j.n)
	for i := range jobs {
		c := *j
		c.index = i
		jobs[i] = &c
		f, ok := s.start(w, r, &c)
		if !ok {
			for _, g := range flights[:i] {
				s.abort(g.req.ID)
			}
			return
		}
		flights[i] = f
	}
	finals := make([]engine.Event, j.n)
	if j.stream {
		out := startSSE(w)
		created := time.Now().Unix()
		for i, f := range flights {
			var err error
			if finals[i], err = s.streamChoice(r, out, chunkFactory{j: jobs[i], model: j.model, created: created}, f); err != nil {
				return
			}
		}
		s.done(r, combined(finals))
		s.endStream(out, chunkFactory{j: j, model: j.model, created: created}, combined(finals))
		return
	}
	for i, f := range flights {
		var err error
		if finals[i], err = s.wait(r.Context(), f, nil); err != nil {
			if r.Context().Err() == nil {
				writeError(w, http.StatusServiceUnavailable, err.Error())
			}
			return
		}
	}
	s.done(r, combined(finals))
	writeJSON(w, s.choicesResponse(jobs, finals))
}

// combined is the Done event the usage of several choices is read from:
// the first choice's prompt, every choice's output.
func combined(finals []engine.Event) engine.Event {
	ev := finals[0]
	for _, f := range finals[1:] {
		ev.OutputTokens += f.OutputTokens
	}
	return ev
}

// choicesResponse is the non-streaming body of several choices.
func (s *Server) choicesResponse(jobs []*job, finals []engine.Event) any {
	first := s.response(jobs[0], finals[0])
	u := usageOf(combined(finals))
	switch r := first.(type) {
	case chatResponse:
		for i := 1; i < len(jobs); i++ {
			next := s.response(jobs[i], finals[i]).(chatResponse)
			r.Choices = append(r.Choices, withIndex(next.Choices[0], i))
		}
		r.Usage = u
		return r
	case completionResponse:
		for i := 1; i < len(jobs); i++ {
			next := s.response(jobs[i], finals[i]).(completionResponse)
			ch := next.Choices[0]
			ch.Index = i
			r.Choices = append(r.Choices, ch)
		}
		r.Usage = u
		return r
	}
	return first
}

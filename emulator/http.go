package emulator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvrouter/kvrouter/engine"
)

// Handler serves the replica's HTTP API: POST /v1/chat/completions,
// POST /v1/completions, GET /v1/models, GET /health, POST /tokenize,
// GET /metrics, and POST TransferPath, the KV-transfer side channel
// (sidechannel.go).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.chat)
	mux.HandleFunc("POST /v1/completions", s.completions)
	mux.HandleFunc("POST /v1/responses", s.responsesAPI)
	mux.HandleFunc("POST /v1/embeddings", s.embeddings)
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("POST /tokenize", s.tokenize)
	if s.ecfg.Kind == engine.KindLlamaCpp {
		mux.HandleFunc("GET /slots", s.slots)
	}
	mux.HandleFunc("POST "+TransferPath, s.serveTransfer)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	return mux
}

// health answers 200 with an empty body while the engine loop runs (or
// has not started yet), 503 once it has stopped.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	select {
	case <-s.stopped:
		w.WriteHeader(http.StatusServiceUnavailable)
	default:
	}
}

// job is a validated generation request.
type job struct {
	id       string
	model    string // the model name responses carry
	lora     string // the adapter, "" for the base model
	tokens   []uint32
	max      int  // output tokens to generate
	explicit bool // max came from the request: finish_reason "length"
	stream   bool
	usage    bool // stream_options.include_usage
	chat     bool
	// n is the choices asked for ("n"; 0 or 1: one), index this job's
	// choice among them (choices.go).
	n, index int
	// stopped says a stop string ends the output (finish_reason "stop"),
	// cut is then the byte length of the output text kept (stop.go).
	cut     int
	stopped bool
	// offset is the index of the first output token in the filler text:
	// the tokens of the partial reply a continue_final_message request
	// continues, so that a continued reply reads as one; 0 otherwise.
	offset int
	// kv is the request's kv_transfer_params; nil without.
	kv *engine.TransferParams
	// hold is set for a prefill leg that holds its blocks for a decode
	// worker, reachable at the side channel sideHost:sidePort
	// (prefill.go).
	hold     bool
	sideHost string
	sidePort int
}

// httpError is an error with its HTTP status and, if not empty, the
// request parameter at fault.
type httpError struct {
	status int
	msg    string
	param  string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &httpError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

// fail answers err as an OpenAI error.
func fail(w http.ResponseWriter, err error) {
	var he *httpError
	if errors.As(err, &he) {
		writeParamError(w, he.status, he.msg, he.param)
		return
	}
	writeError(w, http.StatusBadRequest, err.Error())
}

// decode reads the JSON body into v, bounded by MaxBodyBytes.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return &httpError{status: http.StatusRequestEntityTooLarge,
				msg: fmt.Sprintf("request body exceeds %d bytes", s.cfg.MaxBodyBytes)}
		}
		return badRequest("read body: %v", err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return badRequest("invalid JSON body: %v", err)
	}
	return nil
}

// limits validates the output length against the model length and returns
// the job's max tokens.
func (s *Server) limits(j *job, maxTokens *int, n *int) error {
	if n != nil && (*n < 1 || *n > maxChoices) {
		return badRequest("n must be 1 to %d, got %d", maxChoices, *n)
	}
	if n != nil {
		j.n = *n
	}
	mml := s.ecfg.MaxModelLen
	p := len(j.tokens)
	if p == 0 {
		return badRequest("the prompt is empty")
	}
	if p >= mml {
		return badRequest("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", mml, p)
	}
	if maxTokens == nil {
		j.max = min(DefaultMaxTokens, mml-p)
		return nil
	}
	if *maxTokens < 1 {
		return badRequest("max_tokens must be at least 1, got %d.", *maxTokens)
	}
	if p+*maxTokens > mml {
		return badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			mml, p+*maxTokens, p, *maxTokens)
	}
	j.max, j.explicit = *maxTokens, true
	return nil
}

// request decodes the body into v and resolves the model it names
// (*model, read after decoding); false means it answered the error.
func (s *Server) request(w http.ResponseWriter, r *http.Request, v any, model *string) (servedModel, bool) {
	if err := s.decode(w, r, v); err != nil {
		fail(w, err)
		return servedModel{}, false
	}
	sm, err := s.resolve(*model)
	if err != nil {
		fail(w, err)
		return servedModel{}, false
	}
	return sm, true
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	sm, ok := s.request(w, r, &req, &req.Model)
	if !ok {
		return
	}
	text, offset, err := chatPrompt(&req)
	if err != nil {
		fail(w, badRequest("%v", err))
		return
	}
	j := &job{id: s.newID("chatcmpl-"), model: sm.name, lora: sm.lora, tokens: Tokenize(text), stream: req.Stream, chat: true, offset: offset, kv: req.KVTransferParams}
	j.usage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	maxTokens := req.MaxTokens
	if req.MaxCompletionTokens != nil {
		maxTokens = req.MaxCompletionTokens
	}
	if err := s.limits(j, maxTokens, req.N); err != nil {
		fail(w, err)
		return
	}
	if err := applyStop(j, req.Stop); err != nil {
		fail(w, err)
		return
	}
	s.serve(w, r, j)
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	sm, ok := s.request(w, r, &req, &req.Model)
	if !ok {
		return
	}
	tokens, err := promptTokens(req.Prompt)
	if err != nil {
		fail(w, badRequest("%v", err))
		return
	}
	j := &job{id: s.newID("cmpl-"), model: sm.name, lora: sm.lora, tokens: tokens, stream: req.Stream, kv: req.KVTransferParams}
	j.usage = req.StreamOptions != nil && req.StreamOptions.IncludeUsage
	if err := s.limits(j, req.MaxTokens, req.N); err != nil {
		fail(w, err)
		return
	}
	if err := applyStop(j, req.Stop); err != nil {
		fail(w, err)
		return
	}
	s.serve(w, r, j)
}

// serve submits the job to the engine and answers, streaming or not.
func (s *Server) serve(w http.ResponseWriter, r *http.Request, j *job) {
	if j.n > 1 {
		s.serveChoices(w, r, j)
		return
	}
	f, ok := s.start(w, r, j)
	if !ok {
		return
	}
	if j.stream {
		s.stream(w, r, j, f)
		return
	}
	final, err := s.wait(r.Context(), f, nil)
	if err != nil {
		if r.Context().Err() == nil {
			writeError(w, http.StatusServiceUnavailable, err.Error())
		}
		return
	}
	s.done(r, final)
	writeJSON(w, s.response(j, final))
}

// start submits the job to the engine; false means it answered an error.
func (s *Server) start(w http.ResponseWriter, r *http.Request, j *job) (*flight, bool) {
	f := newFlight(engine.Request{ID: j.engineID(), Tokens: j.tokens, MaxTokens: j.max, LoRA: j.lora})
	if s.cfg.KVFullStatus != 0 || j.kv != nil {
		// Hashed here, off the engine goroutine, for its admission check
		// and a KV transfer.
		f.req.Hashes = s.blockHashes(j.tokens, j.lora)
	}
	s.prefillLeg(r, j, f)
	s.importBlocks(r.Context(), j, f)
	if !toLoop(s, w, r, s.submit, f) {
		return nil, false
	}
	if err := <-f.added; err != nil {
		var full *kvFullError
		if errors.As(err, &full) {
			s.rejected.Add(1)
			writeError(w, s.cfg.KVFullStatus, err.Error())
			return nil, false
		}
		writeError(w, http.StatusBadRequest, err.Error())
		return nil, false
	}
	return f, true
}

// done calls Config.OnDone, if set.
func (s *Server) done(r *http.Request, final engine.Event) {
	if s.cfg.OnDone != nil {
		s.cfg.OnDone(r, final)
	}
}

// toLoop hands v to the engine loop over ch. It reports false, having
// answered 503, when the engine is not running, or when the client went
// away.
func toLoop[T any](s *Server, w http.ResponseWriter, r *http.Request, ch chan<- T, v T) bool {
	select {
	case ch <- v:
		return true
	case <-s.stopped:
		writeError(w, http.StatusServiceUnavailable, "the engine is not running")
	case <-r.Context().Done():
	}
	return false
}

// wait follows f until it is done, calling onTokens (if not nil) with each
// new range of output tokens [from, to) and whether the request is done. A
// canceled ctx (the client went away) cancels the request in the engine.
func (s *Server) wait(ctx context.Context, f *flight, onTokens func(from, to int, done bool, final engine.Event) error) (engine.Event, error) {
	sent := 0
	for {
		select {
		case <-f.notify:
		case <-ctx.Done():
			s.abort(f.req.ID)
			return engine.Event{}, ctx.Err()
		}
		tokens, done, final, err := f.state()
		if err != nil {
			return engine.Event{}, err
		}
		if !done {
			// The last token goes out with the Done event, so that its
			// chunk can carry the finish reason.
			tokens = min(tokens, f.req.MaxTokens-1)
		}
		if onTokens != nil && (tokens > sent || done) {
			if err := onTokens(sent, tokens, done, final); err != nil {
				s.abort(f.req.ID)
				return engine.Event{}, err
			}
			sent = tokens
		}
		if done {
			return final, nil
		}
	}
}

// abort cancels a request in the engine without blocking the handler.
func (s *Server) abort(id string) {
	select {
	case s.cancels <- id:
	case <-s.stopped:
	}
}

func (s *Server) finishReason(j *job, final engine.Event) string {
	if j.stopped && final.OutputTokens >= j.max {
		return "stop"
	}
	if j.explicit && final.OutputTokens >= j.max {
		return "length"
	}
	return "stop"
}

func usageOf(final engine.Event) *usage {
	return &usage{
		PromptTokens:        final.PromptTokens,
		CompletionTokens:    final.OutputTokens,
		TotalTokens:         final.PromptTokens + final.OutputTokens,
		PromptTokensDetails: promptDetails{CachedTokens: final.CachedTokens},
	}
}

// response is the non-streaming body; a prefill leg's carries the
// kv_transfer_params of its held blocks (prefill.go).
func (s *Server) response(j *job, final engine.Event) any {
	reason := s.finishReason(j, final)
	text := j.clip(filler(j.offset, j.offset+final.OutputTokens, j.chat), 0)
	created := time.Now().Unix()
	kv := s.heldParams(j, final, reason)
	if j.chat {
		return chatResponse{
			ID: j.id, Object: "chat.completion", Created: created, Model: j.model,
			Choices:          []chatChoice{{Message: &chatOut{Role: "assistant", Content: &text}, FinishReason: &reason}},
			Usage:            usageOf(final),
			KVTransferParams: kv,
		}
	}
	return completionResponse{
		ID: j.id, Object: "text_completion", Created: created, Model: j.model,
		Choices:          []completionChoice{{Text: text, FinishReason: &reason}},
		Usage:            usageOf(final),
		KVTransferParams: kv,
	}
}

package hashing

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/tokenizer"
)

// tokenSource is how one model's requests become token ids: a local
// tokenizer, the replicas' /tokenize, or neither (text mode).
type tokenSource struct {
	tok    *tokenizer.Tokenizer
	remote bool
}

// tokenHasher is token mode: it turns a request into the engine's own
// token ids (the chat rendered through the model's template, or the
// completions prompt encoded; token-id prompts as given) and hashes their
// full blocks (see Hasher.Hash).
type tokenHasher struct {
	models map[string]tokenSource
	def    tokenSource
	remote *remoteTokenizer // nil unless some source is remote
	fails  atomic.Uint64
	// texted counts requests hashed in text mode (no tokenizer for the
	// model, or a failure).
	texted atomic.Uint64
	// onFallback, if set, is told each failure (Config.OnFallback).
	onFallback func(error)
}

// newTokenHasher loads every tokenizer cfg names. remote answers for the
// Remote sources.
func newTokenHasher(cfg Config, remote *remoteTokenizer) (*tokenHasher, error) {
	h := &tokenHasher{models: map[string]tokenSource{}, remote: remote}
	loaded := map[string]*tokenizer.Tokenizer{}
	source := func(v string) (tokenSource, error) {
		if v == Remote {
			return tokenSource{remote: true}, nil
		}
		if t, ok := loaded[v]; ok {
			return tokenSource{tok: t}, nil
		}
		t, err := tokenizer.Load(v)
		if err != nil {
			return tokenSource{}, fmt.Errorf("tokenizer %s: %w", v, err)
		}
		loaded[v] = t
		return tokenSource{tok: t}, nil
	}
	var err error
	if cfg.Tokenizer != "" {
		if h.def, err = source(cfg.Tokenizer); err != nil {
			return nil, err
		}
	}
	for m, v := range cfg.Tokenizers {
		if h.models[m], err = source(v); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// sourceOf returns model's token source.
func (h *tokenHasher) sourceOf(model string) tokenSource {
	if s, ok := h.models[model]; ok {
		return s
	}
	return h.def
}

// hash appends to sc one chain per block size, from root, and returns the
// prompt's tokens; ok is false when p must be hashed in text mode. Only
// the first prompt of a batch is hashed; all count toward tokens.
func (h *tokenHasher) hash(p *prefix.Prompt, root prefix.Hash, blockSizes []int, sc *Scratch) (n int, ok bool) {
	if !p.Chat && len(p.PromptIDs) > 0 {
		for _, ids := range p.PromptIDs {
			n += len(ids)
		}
		blocks(p.PromptIDs[0], root, blockSizes, sc)
		return n, true
	}
	src := h.sourceOf(p.Model)
	switch {
	case src.tok != nil:
		toks, err := h.local(src.tok, p, sc.toks[:0])
		sc.toks = toks
		if err == nil {
			err = emptyTokens(len(toks), p)
		}
		if err == nil {
			blocks(toks, root, blockSizes, sc)
			return len(toks) + h.moreTokens(src.tok, p), true
		}
		h.fail(err)
	case src.remote && h.remote != nil:
		n, err := h.remote.hash(p, root, blockSizes, sc)
		if err == nil {
			return n, true
		}
		h.fail(err)
	}
	h.texted.Add(1)
	return 0, false
}

// fail counts a tokenizer failure and tells onFallback.
func (h *tokenHasher) fail(err error) {
	h.fails.Add(1)
	if h.onFallback != nil {
		h.onFallback(err)
	}
}

// emptyTokens is the error of a tokenizer that gave no token for a prompt
// with text: routed as a zero-token prompt, the request would match
// nothing and weigh nothing, so it goes to text mode instead.
func emptyTokens(n int, p *prefix.Prompt) error {
	if n > 0 {
		return nil
	}
	for _, s := range p.Prompts {
		if s != "" {
			return errNoTokens
		}
	}
	if p.Chat && len(p.Messages) > 0 {
		return errNoTokens // a template renders every message's role
	}
	return nil
}

// errNoTokens: a tokenizer answered no token for a non-empty prompt.
var errNoTokens = errors.New("tokenizer answered no token for a non-empty prompt")

// blocks appends to sc the chain of toks at every block size.
func blocks(toks []uint32, root prefix.Hash, blockSizes []int, sc *Scratch) {
	for i, bs := range blockSizes {
		sc.keep(i, bs, prefix.Blocks(root, toks, bs, sc.buf(i)))
	}
}

// local tokenizes p's chat (through the template) or first prompt.
func (h *tokenHasher) local(t *tokenizer.Tokenizer, p *prefix.Prompt, out []uint32) ([]uint32, error) {
	if !p.Chat {
		if len(p.Prompts) == 0 {
			return out, nil
		}
		return t.Encode(p.Prompts[0], out), nil
	}
	msgs, err := messagesJSON(p.Messages)
	if err != nil {
		return out, err
	}
	return t.Chat(msgs, p.Tools, out)
}

// moreTokens counts the tokens of a batch's prompts after the first
// (rare; they are not hashed).
func (h *tokenHasher) moreTokens(t *tokenizer.Tokenizer, p *prefix.Prompt) int {
	if p.Chat || len(p.Prompts) < 2 {
		return 0
	}
	n := 0
	var buf []uint32
	for _, s := range p.Prompts[1:] {
		buf = t.Encode(s, buf[:0])
		n += len(buf)
	}
	return n
}

// chatMessage is one message as the chat template (and vLLM's /tokenize)
// reads it: prefix.Message's fields, content flattened to text.
type chatMessage struct {
	Role       string          `json:"role"`
	Content    string          `json:"content"`
	Name       string          `json:"name,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
	ToolCalls  json.RawMessage `json:"tool_calls,omitempty"`
}

// messagesJSON renders parsed messages back to the JSON array the chat
// template takes. Each message renders to the same bytes every time, so
// the tokenizer's per-message memo applies across a conversation's turns.
func messagesJSON(ms []prefix.Message) ([]byte, error) { return json.Marshal(chatMessages(ms)) }

// chatMessages converts parsed messages to their JSON form.
func chatMessages(ms []prefix.Message) []chatMessage {
	out := make([]chatMessage, len(ms))
	for i, m := range ms {
		out[i] = chatMessage{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID, ToolCalls: m.ToolCalls}
	}
	return out
}

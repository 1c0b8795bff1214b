package proxy

import (
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"

	"kvrouter/prefix"
	"kvrouter/tokenizer"
)

// Hash modes of a request, as decision records name them.
const (
	hashText   = "text"
	hashTokens = "tokens"
)

// tokenSource is how one model's requests become token ids: a local
// tokenizer, the replicas' /tokenize, or neither (text mode).
type tokenSource struct {
	tok    *tokenizer.Tokenizer
	remote bool
}

// tokenHasher is the token-mode hasher: it turns a request into the
// engine's own token ids (the chat rendered through the model's template,
// or the completions prompt encoded; token-id prompts as given) and hashes
// full blocks of the engine's block size from prefix.Root(model, ""), the
// root kvevents keys BlockStored token ids under, so the router's hashes
// are the precise index's keys. A model with no tokenizer, or a request
// the tokenizer fails on, is hashed in text mode (it then matches nothing
// the engines reported) and counted in fails.
type tokenHasher struct {
	text   prefix.Text
	models map[string]tokenSource
	def    tokenSource
	remote *remoteTokenizer // nil unless some source is remote
	block  atomic.Int64     // the engine's tokens per block
	fails  atomic.Uint64
	// texted counts requests hashed in text mode (no tokenizer for the
	// model, or a failure).
	texted  atomic.Uint64
	scratch sync.Pool // *[]uint32
}

// defaultBlockSize is the token-mode block size until an engine reports
// its own (vLLM's default).
const defaultBlockSize = 16

// newTokenHasher loads every tokenizer cfg names. remote answers for the
// "remote" sources.
func newTokenHasher(cfg *Config, remote *remoteTokenizer) (*tokenHasher, error) {
	h := &tokenHasher{text: prefix.Text{ChunkChars: cfg.ChunkChars}, models: map[string]tokenSource{}, remote: remote}
	h.block.Store(defaultBlockSize)
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

// TokensPerBlock is the engine's block size.
func (h *tokenHasher) TokensPerBlock() int { return int(h.block.Load()) }

// setBlockSize follows the engine's reported block size.
func (h *tokenHasher) setBlockSize(n int) {
	if n > 0 {
		h.block.Store(int64(n))
	}
}

// Hashes appends p's block hashes to out and returns them with p's prompt
// tokens (exact in token mode). Only the first prompt of a batch is
// hashed; all count toward tokens.
func (h *tokenHasher) Hashes(p *prefix.Prompt, out []prefix.Hash) ([]prefix.Hash, int) {
	bs := h.TokensPerBlock()
	root := prefix.Root(p.Model, "")
	if !p.Chat && len(p.PromptIDs) > 0 {
		n := 0
		for _, ids := range p.PromptIDs {
			n += len(ids)
		}
		return prefix.Blocks(root, p.PromptIDs[0], bs, out), n
	}
	src := h.sourceOf(p.Model)
	switch {
	case src.tok != nil:
		sp := h.tokens()
		defer h.scratch.Put(sp)
		toks, err := h.local(src.tok, p, (*sp)[:0])
		*sp = toks
		if err == nil {
			return prefix.Blocks(root, toks, bs, out), len(toks) + h.moreTokens(src.tok, p)
		}
		h.fails.Add(1)
	case src.remote && h.remote != nil:
		if hs, n, ok := h.remote.hashes(p, root, bs, out); ok {
			return hs, n
		}
		h.fails.Add(1)
	}
	h.texted.Add(1)
	return h.text.Hashes(p, out)
}

func (h *tokenHasher) tokens() *[]uint32 {
	if sp, ok := h.scratch.Get().(*[]uint32); ok {
		return sp
	}
	s := make([]uint32, 0, 4096)
	return &s
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

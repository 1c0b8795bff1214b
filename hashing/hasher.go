// Package hashing turns a parsed request into the chains of block hashes
// the residency tracker matches (residency.Chain).
//
// Text mode (the default, no configuration): prefix.Text's canonical
// rendering of the request, cut into chunks of a fixed number of bytes and
// chained, one chain for every replica. Token mode: the engine's own token
// ids (the chat rendered through the model's template and tokenized
// locally, or the replicas' POST /tokenize), hashed in full blocks of each
// engine block size the fleet has, from prefix.Root(base model, LoRA
// adapter): the root package kvevents keys the engines' BlockStored token
// ids under, so that token-mode chains are the precise index's keys.
package hashing

import (
	"fmt"
	"net/http"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
)

// Remote is the tokenizer source that asks the replicas' /tokenize.
const Remote = "remote"

// Modes, as decision records and views name them.
const (
	ModeText   = "text"
	ModeTokens = "tokens"
)

// Config selects the mode and its tokenizers.
type Config struct {
	// ChunkChars is the text-mode block size in bytes; zero means 64.
	ChunkChars int
	// Tokenizer puts every model in token mode: a directory holding a
	// Hugging Face tokenizer.json (and tokenizer_config.json for the chat
	// template), or Remote. Empty means text mode, unless Tokenizers
	// names the model.
	Tokenizer string
	// Tokenizers maps a model name to its tokenizer source, overriding
	// Tokenizer for that model.
	Tokenizers map[string]string
	// Client makes the /tokenize calls; nil means http.DefaultClient.
	Client *http.Client
	// Pick returns the base URL of a healthy replica to tokenize on, ""
	// when none is; needed with Remote.
	Pick func() string
	// Engine names the engine a replica's base URL runs (scrape.Engine*),
	// which decides how it is asked to tokenize: llama.cpp renders the
	// chat with POST /apply-template and tokenizes {"content"}; any other
	// (or nil, or "") is asked as vLLM is.
	Engine func(base string) string
	// OnFallback, if set, is told every tokenizer failure that sends a
	// request to text mode (a replica's error, an empty token list for a
	// non-empty prompt); it must not block.
	OnFallback func(err error)
}

// Hasher hashes requests. It is safe for concurrent use.
type Hasher struct {
	text   prefix.Text
	tok    *tokenHasher     // nil in text mode
	remote *remoteTokenizer // nil unless a source is Remote
}

// New loads every tokenizer cfg names.
func New(cfg Config) (*Hasher, error) {
	h := &Hasher{text: prefix.Text{ChunkChars: cfg.ChunkChars}}
	if cfg.Tokenizer == "" && len(cfg.Tokenizers) == 0 {
		return h, nil
	}
	remote := cfg.Tokenizer == Remote
	for _, v := range cfg.Tokenizers {
		remote = remote || v == Remote
	}
	if remote {
		if cfg.Pick == nil {
			return nil, fmt.Errorf("hashing: a %q tokenizer needs Config.Pick", Remote)
		}
		client := cfg.Client
		if client == nil {
			client = http.DefaultClient
		}
		h.remote = newRemoteTokenizer(client, cfg.Pick)
		h.remote.engine = cfg.Engine
	}
	t, err := newTokenHasher(cfg, h.remote)
	if err != nil {
		return nil, err
	}
	t.onFallback = cfg.OnFallback
	h.tok = t
	return h, nil
}

// Engine reports whether the chains are engine-aligned (token mode).
func (h *Hasher) Engine() bool { return h.tok != nil }

// Mode returns ModeText or ModeTokens.
func (h *Hasher) Mode() string {
	if h.tok != nil {
		return ModeTokens
	}
	return ModeText
}

// TextTokens is the prompt tokens one text-mode block stands for.
func (h *Hasher) TextTokens() int { return h.text.TokensPerBlock() }

// Stats counts token mode's fallbacks.
type Stats struct {
	// Fails counts requests a tokenizer failed on; Texted those hashed in
	// text mode (no tokenizer for the model, or a failure); RoundTrips
	// the /tokenize calls made.
	Fails, Texted, RoundTrips uint64
}

// Stats returns the counts so far.
func (h *Hasher) Stats() Stats {
	var s Stats
	if h.tok != nil {
		s.Fails, s.Texted = h.tok.fails.Load(), h.tok.texted.Load()
	}
	if h.remote != nil {
		s.RoundTrips = h.remote.roundTrips()
	}
	return s
}

// Scratch holds one request's chains; keep one per goroutine and reuse it.
type Scratch struct {
	chains []residency.Chain
	bufs   [][]prefix.Hash
	toks   []uint32
}

// buf returns the i-th hash buffer, emptied.
func (sc *Scratch) buf(i int) []prefix.Hash {
	for len(sc.bufs) <= i {
		sc.bufs = append(sc.bufs, nil)
	}
	return sc.bufs[i][:0]
}

// keep stores b as the i-th buffer and appends its chain.
func (sc *Scratch) keep(i int, tokens int, b []prefix.Hash) {
	sc.bufs[i] = b
	sc.chains = append(sc.chains, residency.Chain{Tokens: tokens, Hashes: b})
}

// Hash returns p's chains and its prompt tokens (exact in token mode, an
// estimate in text mode). Text mode gives one chain. Token mode gives one
// chain per block size of blockSizes, chained from root (the model's
// prefix.Root(base, lora)), none when blockSizes is empty; a model without
// a tokenizer, or a request its tokenizer fails on, gets one text-mode
// chain instead (it then matches nothing the engines reported; counted in
// Stats). The chains alias sc until its next use.
func (h *Hasher) Hash(p *prefix.Prompt, root prefix.Hash, blockSizes []int, sc *Scratch) ([]residency.Chain, int) {
	sc.chains = sc.chains[:0]
	if h.tok != nil {
		if n, ok := h.tok.hash(p, root, blockSizes, sc); ok {
			return sc.chains, n
		}
	}
	b, n := h.text.Hashes(p, sc.buf(0))
	sc.keep(0, h.text.TokensPerBlock(), b)
	return sc.chains, n
}

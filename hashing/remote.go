package hashing

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/scrape"
)

// remoteTokenizer asks a healthy replica's POST /tokenize for a request's
// token ids, as vLLM accepts it: {"model","prompt"} for completions,
// {"model","messages"[,"tools"]} for chat. /tokenize takes the whole
// conversation, so the memo is keyed by the full tokenize request and the
// root: a repeated request costs nothing, a conversation's new turn costs
// one round trip to a replica (about a millisecond on a LAN, while the
// engine renders and tokenizes it) before it can be routed. When no replica
// is healthy or the call fails (timeout: remoteTimeout), the request is
// hashed in text mode (Hasher.Hash).
//
// The memo keeps block hashes, not tokens (8 bytes per block instead of 4
// per token), for each block size asked; it holds at most remoteMemo
// requests and is dropped whole when full.
type remoteTokenizer struct {
	client *http.Client
	// pick returns the base URL of a healthy replica, "" if none.
	pick func() string
	// engine names a replica's engine (Config.Engine); nil means vLLM's
	// form for every replica.
	engine func(base string) string

	mu   sync.Mutex
	memo map[uint64]remoteEntry
	// calls counts /tokenize round trips.
	calls uint64
}

// remoteEntry is one memoised request: its tokens and its chains by block
// size.
type remoteEntry struct {
	tokens int
	chains map[int][]prefix.Hash
}

const (
	remoteMemo    = 4096
	remoteTimeout = 2 * time.Second
	// maxTokenizeBody bounds a /tokenize answer read, before decoding.
	maxTokenizeBody = 64 << 20
)

func newRemoteTokenizer(client *http.Client, pick func() string) *remoteTokenizer {
	return &remoteTokenizer{client: client, pick: pick, memo: map[uint64]remoteEntry{}}
}

// tokenizeRequest is the body of POST /tokenize.
type tokenizeRequest struct {
	Model    string          `json:"model"`
	Prompt   *string         `json:"prompt,omitempty"`
	Messages []chatMessage   `json:"messages,omitempty"`
	Tools    json.RawMessage `json:"tools,omitempty"`
}

// hash appends to sc p's chains at every block size, from root, and
// returns its tokens; the error says why the tokens could not be had.
func (r *remoteTokenizer) hash(p *prefix.Prompt, root prefix.Hash, blockSizes []int, sc *Scratch) (tokens int, err error) {
	body, err := tokenizeBody(p)
	if err != nil {
		return 0, err
	}
	key := xxhash.Sum64(body) ^ uint64(root)*0x9E3779B97F4A7C15
	r.mu.Lock()
	e, hit := r.memo[key]
	for _, bs := range blockSizes {
		if _, has := e.chains[bs]; !has {
			hit = false
		}
	}
	if hit {
		for i, bs := range blockSizes {
			sc.keep(i, bs, append(sc.buf(i), e.chains[bs]...))
		}
		r.mu.Unlock()
		return e.tokens, nil
	}
	r.mu.Unlock()
	toks, err := r.call(p, body)
	if err == nil {
		err = emptyTokens(len(toks), p)
	}
	if err != nil {
		return 0, err
	}
	blocks(toks, root, blockSizes, sc)
	e = remoteEntry{tokens: len(toks), chains: make(map[int][]prefix.Hash, len(blockSizes))}
	for _, c := range sc.chains {
		e.chains[c.Tokens] = slices.Clone(c.Hashes)
	}
	r.mu.Lock()
	if len(r.memo) >= remoteMemo {
		clear(r.memo)
	}
	r.memo[key] = e
	r.mu.Unlock()
	return e.tokens, nil
}

// tokenizeBody builds the /tokenize request for p.
func tokenizeBody(p *prefix.Prompt) ([]byte, error) {
	req := tokenizeRequest{Model: p.Model}
	if p.Chat {
		req.Messages, req.Tools = chatMessages(p.Messages), p.Tools
	} else {
		if len(p.Prompts) == 0 {
			return nil, fmt.Errorf("no text prompt")
		}
		req.Prompt = &p.Prompts[0]
	}
	return json.Marshal(req)
}

// call asks a healthy replica for p's tokens: body (vLLM's form) to its
// /tokenize, or llama.cpp's two calls (llamacpp.go).
func (r *remoteTokenizer) call(p *prefix.Prompt, body []byte) ([]uint32, error) {
	base := r.pick()
	if base == "" {
		return nil, fmt.Errorf("tokenize: no healthy replica")
	}
	ctx, cancel := context.WithTimeout(context.Background(), remoteTimeout)
	defer cancel()
	if r.engine != nil && r.engine(base) == scrape.EngineLlamaCpp {
		return r.llamaCpp(ctx, base, p)
	}
	var v struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := r.post(ctx, base, "/tokenize", body, &v); err != nil {
		return nil, err
	}
	return v.Tokens, nil
}

// post sends body to base+path and decodes the JSON answer into v.
func (r *remoteTokenizer) post(ctx context.Context, base, path string, body []byte, v any) error {
	r.mu.Lock()
	r.calls++
	r.mu.Unlock()
	resp, err := r.do(ctx, base+path, body)
	if err != nil && ctx.Err() == nil {
		// Once more: a kept-alive connection the replica closed meanwhile
		// fails the request after it was written (llama-server closes
		// idle ones after 5 s), which the transport does not retry for a
		// POST; tokenizing twice does no harm.
		resp, err = r.do(ctx, base+path, body)
	}
	if err != nil {
		return fmt.Errorf("tokenize %s%s: %w", base, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("tokenize %s%s: status %d", base, path, resp.StatusCode)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxTokenizeBody)).Decode(v); err != nil {
		return fmt.Errorf("tokenize %s%s: %w", base, path, err)
	}
	return nil
}

// do posts body as JSON to url.
func (r *remoteTokenizer) do(ctx context.Context, url string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	// Tokenizing changes nothing: the transport may send it again on a
	// fresh connection when the kept-alive one it took was closed before
	// an answer (a key of no value is not sent; net/http,
	// Request.isReplayable).
	req.Header["X-Idempotency-Key"] = nil
	return r.client.Do(req)
}

// roundTrips returns the number of /tokenize calls made.
func (r *remoteTokenizer) roundTrips() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

package proxy

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

	"kvrouter/prefix"
)

// remoteTokenizer asks a healthy replica's POST /tokenize for a request's
// token ids, as vLLM accepts it: {"model","prompt"} for completions,
// {"model","messages"[,"tools"]} for chat. /tokenize takes the whole
// conversation, so the cache is keyed by the full tokenize request: a
// repeated request costs nothing, a conversation's new turn costs one
// round trip to a replica (about a millisecond on a LAN, while the engine
// renders and tokenizes it) before it can be routed. When no replica is
// healthy or the call fails (timeout: remoteTimeout), the request is
// hashed in text mode (tokenHasher.Hashes).
//
// The cache keeps block hashes, not tokens (8 bytes per block instead of 4
// per token), for the block size they were made with; it holds at most
// remoteMemo requests and is dropped whole when full.
type remoteTokenizer struct {
	client *http.Client
	// pick returns the base URL of a healthy replica, "" if none.
	pick func() string

	mu   sync.Mutex
	memo map[uint64]remoteEntry
	// calls counts /tokenize round trips.
	calls uint64
}

type remoteEntry struct {
	hashes []prefix.Hash
	tokens int
	block  int
}

const (
	remoteMemo    = 4096
	remoteTimeout = 2 * time.Second
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

// hashes appends p's block hashes (from root, bs tokens a block) to out.
// ok is false when the tokens could not be had.
func (r *remoteTokenizer) hashes(p *prefix.Prompt, root prefix.Hash, bs int, out []prefix.Hash) (_ []prefix.Hash, tokens int, ok bool) {
	body, err := tokenizeBody(p)
	if err != nil {
		return out, 0, false
	}
	key := xxhash.Sum64(body)
	r.mu.Lock()
	e, hit := r.memo[key]
	r.mu.Unlock()
	if hit && e.block == bs {
		return append(out, e.hashes...), e.tokens, true
	}
	toks, err := r.call(body)
	if err != nil {
		return out, 0, false
	}
	start := len(out)
	out = prefix.Blocks(root, toks, bs, out)
	e = remoteEntry{hashes: slices.Clone(out[start:]), tokens: len(toks), block: bs}
	r.mu.Lock()
	if len(r.memo) >= remoteMemo {
		clear(r.memo)
	}
	r.memo[key] = e
	r.mu.Unlock()
	return out, e.tokens, true
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

// call posts body to a healthy replica's /tokenize and returns its tokens.
func (r *remoteTokenizer) call(body []byte) ([]uint32, error) {
	base := r.pick()
	if base == "" {
		return nil, fmt.Errorf("tokenize: no healthy replica")
	}
	r.mu.Lock()
	r.calls++
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), remoteTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/tokenize", bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("tokenize %s: %w", base, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("tokenize %s: %w", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("tokenize %s: status %d", base, resp.StatusCode)
	}
	var v struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&v); err != nil {
		return nil, fmt.Errorf("tokenize %s: %w", base, err)
	}
	return v.Tokens, nil
}

// roundTrips returns the number of /tokenize calls made.
func (r *remoteTokenizer) roundTrips() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

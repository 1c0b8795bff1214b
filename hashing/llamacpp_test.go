package hashing

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/scrape"
)

// fakeLlamaCpp answers /apply-template and /tokenize as llama-server
// does: a template that wraps each message in role markup, and one token
// per byte plus a BOS when add_special. vLLM's /tokenize body (no
// "content") gets {"tokens":[]}, as llama-server answers it.
func fakeLlamaCpp(t *testing.T) *httptest.Server {
	t.Helper()
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/apply-template":
			var req struct {
				Messages []struct{ Role, Content string } `json:"messages"`
			}
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			var b strings.Builder
			for _, m := range req.Messages {
				b.WriteString("<|" + m.Role + "|>\n" + m.Content + "<|end|>\n")
			}
			b.WriteString("<|assistant|>\n")
			json.NewEncoder(w).Encode(map[string]string{"prompt": b.String()})
		case "/tokenize":
			var req struct {
				Content    *string `json:"content"`
				AddSpecial bool    `json:"add_special"`
			}
			json.NewDecoder(r.Body).Decode(&req)
			toks := []uint32{}
			if req.Content != nil {
				if req.AddSpecial {
					toks = append(toks, 1)
				}
				for _, c := range []byte(*req.Content) {
					toks = append(toks, uint32(c)+3)
				}
			}
			json.NewEncoder(w).Encode(map[string][]uint32{"tokens": toks})
		default:
			http.NotFound(w, r)
		}
	}))
}

// TestRemoteLlamaCpp: against a llama.cpp replica the remote tokenizer
// renders the chat with /apply-template and tokenizes the text with the
// model's special tokens, so the token count is the engine's; asked as
// vLLM is (the replica's engine unknown), the same replica answers no
// token, which is an error: the request goes to text mode, counted and
// told to OnFallback.
func TestRemoteLlamaCpp(t *testing.T) {
	srv := fakeLlamaCpp(t)
	defer srv.Close()
	body := []byte(`{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello there"}]}`)
	want := 1 + len("<|system|>\nBe brief.<|end|>\n<|user|>\nHello there<|end|>\n<|assistant|>\n")
	root := prefix.Root("m", "")
	for _, engine := range []string{scrape.EngineLlamaCpp, ""} {
		var mu sync.Mutex
		var fallbacks []error
		h, err := New(Config{
			Tokenizer: Remote, Pick: func() string { return srv.URL },
			Engine:     func(string) string { return engine },
			OnFallback: func(err error) { mu.Lock(); fallbacks = append(fallbacks, err); mu.Unlock() },
		})
		if err != nil {
			t.Fatal(err)
		}
		p, err := prefix.Parse(body)
		if err != nil {
			t.Fatal(err)
		}
		var sc Scratch
		chains, n := h.Hash(p, root, []int{16}, &sc)
		st := h.Stats()
		if engine == scrape.EngineLlamaCpp {
			if n != want || st.Fails != 0 || len(chains) != 1 || len(chains[0].Hashes) != want/16 || st.RoundTrips != 2 {
				t.Errorf("llamacpp: %d tokens, %d chains, stats %+v; want %d tokens in %d blocks, 2 round trips, no failure", n, len(chains), st, want, want/16)
			}
			continue
		}
		text, _ := prefix.Text{}.Hashes(p, nil)
		if st.Fails != 1 || st.Texted != 1 || len(chains) != 1 || !slices.Equal(chains[0].Hashes, text) {
			t.Errorf("vLLM form to llama.cpp: stats %+v, chains %v; want one failure hashed in text mode", st, chains)
		}
		if len(fallbacks) != 1 || !errors.Is(fallbacks[0], errNoTokens) {
			t.Errorf("OnFallback got %v, want one errNoTokens", fallbacks)
		}
	}
}

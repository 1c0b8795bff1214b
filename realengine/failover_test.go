package realengine

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/loadgen"
	"github.com/kvrouter/kvrouter/proxy"
)

// chatBody is a chat request of one system and one user message.
func chatBody(t *testing.T, user string, maxTokens int, stream bool) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{
		"model": model, "max_tokens": maxTokens, "stream": stream,
		"messages": []map[string]string{
			{"role": "system", "content": "You answer questions about the cache."},
			{"role": "user", "content": user},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// post sends body to the router's chat completions.
func post(t *testing.T, url string, body []byte) *http.Response {
	t.Helper()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestStreamContinuedOnRealEngine: a replica killed while it streams an
// answer: the router continues the stream on another llama-server, and
// the client reads it to its end, with no error; requests sent right
// after all succeed on the others.
func TestStreamContinuedOnRealEngine(t *testing.T) {
	reps := startFleet(t, 3)
	k := router(t, "round-robin", "", reps)
	resp := post(t, k.URL, chatBody(t, "Tell me a very long story about caches.", 2000, true))
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	victim := resp.Header.Get(loadgen.HeaderReplica)
	rd := bufio.NewReader(resp.Body)
	var text strings.Builder
	killed := false
	done := false
	for {
		line, err := rd.ReadString('\n')
		if strings.HasPrefix(line, "data: ") {
			data := strings.TrimSpace(strings.TrimPrefix(line, "data: "))
			if data == "[DONE]" {
				done = true
				break
			}
			if strings.Contains(data, `"error"`) {
				t.Fatalf("stream ended with an error event: %s", data)
			}
			text.WriteString(data)
			if !killed {
				for _, r := range reps {
					if r.URL == victim {
						r.kill() // mid-stream: the answer's first tokens are out
						killed = true
					}
				}
				if !killed {
					t.Fatalf("no replica %q among the fleet", victim)
				}
			}
		}
		if err != nil {
			break
		}
	}
	if !done {
		t.Fatalf("stream ended without [DONE] after %d bytes", text.Len())
	}
	if c := k.metric(t, "kvrouter_stream_failures_total"); c < 1 {
		t.Errorf("kvrouter_stream_failures_total = %v, want the killed stream counted (continued)", c)
	}
	for i := range 6 {
		resp := post(t, k.URL, chatBody(t, "Question "+strings.Repeat("again ", i), 4, false))
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("request %d after the kill: status %d: %s", i, resp.StatusCode, b)
		}
	}
	t.Logf("retries %v, stream failures %v", k.metric(t, "kvrouter_retries_total"), k.metric(t, "kvrouter_stream_failures_total"))
}

// TestRemoteTokenizerOnRealEngine: with --tokenizer remote the router
// tokenizes each request on a llama-server (/apply-template, then
// /tokenize) as the engine does: its token count is the engine's
// usage.prompt_tokens, request by request. Declared a vLLM (engine=vllm),
// the same replica is asked vLLM's {"model","messages"}, answers no
// token, and the request falls back to text mode, counted.
func TestRemoteTokenizerOnRealEngine(t *testing.T) {
	reps := startFleet(t, 2)
	k := router(t, "kv-aware", proxy.Remote, reps)
	for i := range 6 {
		resp := post(t, k.URL, chatBody(t, "How are prompts tokenized? "+strings.Repeat("More detail please. ", i*7), 4, false))
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
	}
	ds := k.Decisions(100)
	if len(ds) != 6 {
		t.Fatalf("%d decisions, want 6", len(ds))
	}
	for _, d := range ds {
		if d.PromptTokens == 0 || d.Tokens != d.PromptTokens {
			t.Errorf("decision %s: router counted %d tokens, the engine %d", d.ID, d.Tokens, d.PromptTokens)
		}
	}
	if f := k.metric(t, "kvrouter_tokenize_fallbacks_total"); f != 0 {
		t.Errorf("%v fallbacks to text mode, want none", f)
	}

	asVLLM := router(t, "kv-aware", proxy.Remote, nil, proxy.Backend{URL: reps[0].URL, Engine: "vllm"})
	wait.For(t, "the replica declared vLLM healthy and scraped", func() bool {
		r := asVLLM.View(time.Now()).Replicas[0]
		return r.Healthy && r.Scraped
	})
	resp := post(t, asVLLM.URL, chatBody(t, "Tokenize me as vLLM would.", 4, false))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if f := asVLLM.metric(t, "kvrouter_tokenize_fallbacks_total"); f != 1 {
		t.Errorf("kvrouter_tokenize_fallbacks_total = %v, want 1 (llama.cpp answers vLLM's form with no token)", f)
	}
}

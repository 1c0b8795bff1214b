package emulator

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/wait"
)

func TestSamePromptTwiceIsCached(t *testing.T) {
	s := start(t, Config{TimeScale: 0.1})
	prompt := words("sp", 6000) // ~6000 tokens: ~0.4 s of prefill, 40 ms of wall time
	body := map[string]any{"model": "m", "prompt": prompt, "max_tokens": 4, "stream": true,
		"stream_options": map[string]any{"include_usage": true}}
	usage := func(st streamed) testResponse {
		return decodeResponse(t, []byte(st.events[len(st.events)-2]))
	}
	first := streamPost(t, s.URL()+"/v1/completions", body)
	second := streamPost(t, s.URL()+"/v1/completions", body)
	u1, u2 := usage(first), usage(second)
	if got := u1.Usage.PromptTokensDetails.CachedTokens; got != 0 {
		t.Errorf("first request: cached_tokens %d, want 0", got)
	}
	p := u2.Usage.PromptTokens
	if got, want := u2.Usage.PromptTokensDetails.CachedTokens, p/16*16-16; got < want {
		t.Errorf("second request: cached_tokens %d, want >= %d of %d", got, want, p)
	}
	if second.first >= first.first {
		t.Errorf("TTFT (wall) second %v, want < first %v", second.first, first.first)
	}
	t.Logf("prompt %d tokens: TTFT %v uncached, %v cached", p, first.first, second.first)
}

func TestConversationReusesFirstTurn(t *testing.T) {
	s := start(t, Config{})
	msgs := []map[string]any{
		{"role": "system", "content": "You are a helpful assistant. " + words("sy", 200)},
		{"role": "user", "content": "Tell me about prefix caching."},
	}
	code, b := post(t, s.URL()+"/v1/chat/completions", map[string]any{"model": "m", "messages": msgs, "max_tokens": 20})
	if code != 200 {
		t.Fatalf("turn 1: status %d: %s", code, b)
	}
	r1 := decodeResponse(t, b)
	if r1.Object != "chat.completion" || r1.Choices[0].Message.Role != "assistant" {
		t.Errorf("turn 1: object %q role %q", r1.Object, r1.Choices[0].Message.Role)
	}
	if got := r1.Usage.CompletionTokens; got != 20 {
		t.Errorf("turn 1: completion_tokens %d, want 20", got)
	}
	msgs = append(msgs,
		map[string]any{"role": "assistant", "content": r1.Choices[0].Message.Content},
		map[string]any{"role": "user", "content": []map[string]any{{"type": "text", "text": "And routing?"}}})
	code, b = post(t, s.URL()+"/v1/chat/completions", map[string]any{"model": "m", "messages": msgs, "max_completion_tokens": 5})
	if code != 200 {
		t.Fatalf("turn 2: status %d: %s", code, b)
	}
	r2 := decodeResponse(t, b)
	p1 := r1.Usage.PromptTokens
	if got, want := r2.Usage.PromptTokensDetails.CachedTokens, p1/16*16; got < want {
		t.Errorf("turn 2: cached_tokens %d, want >= %d (turn 1's full blocks)", got, want)
	}
	// The reply re-tokenizes to as many tokens as were generated.
	if got := CountTokens(r1.Choices[0].Message.Content); got != 20 {
		t.Errorf("reply %q tokenizes to %d tokens, want 20", r1.Choices[0].Message.Content, got)
	}
	if got := r2.Usage.CompletionTokens; got != 5 {
		t.Errorf("turn 2: completion_tokens %d, want 5 (max_completion_tokens)", got)
	}
}

func TestStreamingChat(t *testing.T) {
	s := start(t, Config{})
	tests := []struct {
		name         string
		includeUsage bool
	}{
		{"plain", false},
		{"include_usage", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := map[string]any{"model": "m", "stream": true, "max_tokens": 7,
				"messages": []map[string]any{{"role": "user", "content": "hi " + tt.name}}}
			if tt.includeUsage {
				body["stream_options"] = map[string]any{"include_usage": true}
			}
			st := streamPost(t, s.URL()+"/v1/chat/completions", body)
			n := len(st.events)
			if st.events[n-1] != "[DONE]" {
				t.Fatalf("last event %q, want [DONE]", st.events[n-1])
			}
			chunks := st.events[:n-1]
			want := 1 + 7 // role chunk, one chunk per token
			if tt.includeUsage {
				want++
			}
			if len(chunks) != want {
				t.Fatalf("%d chunks, want %d: %q", len(chunks), want, chunks)
			}
			var text strings.Builder
			for i, c := range chunks {
				var raw map[string]json.RawMessage
				json.Unmarshal([]byte(c), &raw)
				u, has := raw["usage"]
				last := tt.includeUsage && i == len(chunks)-1
				switch {
				case !tt.includeUsage && has:
					t.Errorf("chunk %d has usage without include_usage: %s", i, c)
				case tt.includeUsage && !last && string(u) != "null":
					t.Errorf("chunk %d: usage %s, want null", i, u)
				}
				var r testResponse
				if err := json.Unmarshal([]byte(c), &r); err != nil {
					t.Fatal(err)
				}
				if r.Object != "chat.completion.chunk" {
					t.Errorf("chunk %d: object %q", i, r.Object)
				}
				if last {
					if len(r.Choices) != 0 || r.Usage == nil || r.Usage.CompletionTokens != 7 ||
						r.Usage.PromptTokensDetails == nil {
						t.Errorf("final usage chunk %s", c)
					}
					continue
				}
				d := r.Choices[0].Delta
				if i == 0 && (d.Role == nil || *d.Role != "assistant") {
					t.Errorf("first chunk has no assistant role: %s", c)
				}
				if d.Content != nil {
					text.WriteString(*d.Content)
				}
				fr := r.Choices[0].FinishReason
				if isLast := i == 7; isLast != (fr != nil) || (fr != nil && *fr != "length") {
					t.Errorf("chunk %d: finish_reason %v", i, fr)
				}
			}
			if got := CountTokens(text.String()); got != 7 {
				t.Errorf("streamed text %q is %d tokens, want 7", text.String(), got)
			}
		})
	}
}

func TestCompletionNonStreaming(t *testing.T) {
	s := start(t, Config{})
	tests := []struct {
		name   string
		body   map[string]any
		tokens int
		reason string
	}{
		{"max_tokens", map[string]any{"prompt": "Once upon a time", "max_tokens": 3}, 3, "length"},
		{"default", map[string]any{"prompt": "Once upon a time"}, DefaultMaxTokens, "stop"},
		{"token ids", map[string]any{"model": "m", "prompt": []int{1, 2, 3, 4}, "max_tokens": 2}, 2, "length"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, b := post(t, s.URL()+"/v1/completions", tt.body)
			if code != 200 {
				t.Fatalf("status %d: %s", code, b)
			}
			r := decodeResponse(t, b)
			if r.Object != "text_completion" || r.Model != "m" {
				t.Errorf("object %q model %q", r.Object, r.Model)
			}
			if got := r.Usage.CompletionTokens; got != tt.tokens {
				t.Errorf("completion_tokens %d, want %d", got, tt.tokens)
			}
			if got := CountTokens(r.Choices[0].Text); got != tt.tokens {
				t.Errorf("text is %d tokens, want %d", got, tt.tokens)
			}
			if got := *r.Choices[0].FinishReason; got != tt.reason {
				t.Errorf("finish_reason %q, want %q", got, tt.reason)
			}
			if r.Usage.TotalTokens != r.Usage.PromptTokens+r.Usage.CompletionTokens {
				t.Errorf("total_tokens %d != %d + %d", r.Usage.TotalTokens, r.Usage.PromptTokens, r.Usage.CompletionTokens)
			}
		})
	}
}

func TestBadInput(t *testing.T) {
	s := start(t, Config{MaxBodyBytes: 4096})
	long := words("lo", 2000)
	tests := []struct {
		name, path string
		body       any
		status     int
		msg        string
	}{
		{"malformed json", "/v1/chat/completions", `{"model": "m", "messages": [`, 400, "invalid JSON"},
		{"missing messages", "/v1/chat/completions", map[string]any{"model": "m"}, 400, "messages"},
		{"missing role", "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"content": "x"}}}, 400, "role"},
		{"missing prompt", "/v1/completions", map[string]any{"model": "m"}, 400, "prompt"},
		{"unknown model", "/v1/chat/completions", map[string]any{"model": "gpt-9",
			"messages": []map[string]any{{"role": "user", "content": "x"}}}, 404, "does not exist"},
		{"max_tokens 0", "/v1/completions", map[string]any{"prompt": "x", "max_tokens": 0}, 400, "max_tokens"},
		{"max_tokens negative", "/v1/chat/completions", map[string]any{"max_tokens": -3,
			"messages": []map[string]any{{"role": "user", "content": "x"}}}, 400, "max_tokens"},
		{"n past its bound", "/v1/completions", map[string]any{"prompt": "x", "n": 65}, 400, "n must be 1 to 64"},
		{"n 0", "/v1/completions", map[string]any{"prompt": "x", "n": 0}, 400, "n must be 1 to 64"},
		{"prompt + output too long", "/v1/completions", map[string]any{"prompt": []int{1, 2, 3}, "max_tokens": 1 << 30}, 400, "maximum context length"},
		{"oversized body", "/v1/completions", map[string]any{"prompt": long}, 413, "exceeds"},
		{"tokenize nothing", "/tokenize", map[string]any{"model": "m"}, 400, "prompt or messages"},
		{"tokenize unknown model", "/tokenize", map[string]any{"model": "x", "prompt": "a"}, 404, "does not exist"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, b := post(t, s.URL()+tt.path, tt.body)
			if code != tt.status {
				t.Errorf("status %d, want %d: %s", code, tt.status, b)
			}
			e := decodeError(t, b)
			if e.Code != tt.status || e.Type == "" || !strings.Contains(e.Message, tt.msg) {
				t.Errorf("error %+v, want code %d and a message containing %q", e, tt.status, tt.msg)
			}
		})
	}
	// The server keeps serving.
	code, b := post(t, s.URL()+"/v1/completions", map[string]any{"prompt": "still there?", "max_tokens": 1})
	if code != 200 {
		t.Errorf("after bad input: status %d: %s", code, b)
	}
}

func TestPromptLongerThanModel(t *testing.T) {
	s := start(t, Config{KVBlocks: 64})
	mml := s.EngineConfig().MaxModelLen
	code, b := post(t, s.URL()+"/v1/completions", map[string]any{"prompt": words("xx", mml+10)})
	if code != 400 || !strings.Contains(string(b), "maximum context length") {
		t.Errorf("status %d: %s", code, b)
	}
}

func TestWaitingRequestsShowInMetrics(t *testing.T) {
	s := start(t, Config{MaxNumSeqs: 2, TimeScale: 0.05})
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			post(t, s.URL()+"/v1/completions", map[string]any{"prompt": words("wa", 50+i), "max_tokens": 300})
		})
	}
	var waiting, running float64
	wait.For(t, "num_requests_waiting > 0 with a full batch", func() bool {
		m := scrape(t, s.URL())
		waiting = metric(t, m, "vllm:num_requests_waiting")
		running = metric(t, m, "vllm:num_requests_running")
		if running > 2 {
			t.Fatalf("num_requests_running %g > max_num_seqs 2", running)
		}
		return waiting > 0 && running == 2
	})
	wg.Wait()
	m := scrape(t, s.URL())
	if got := metric(t, m, "vllm:num_requests_waiting"); got != 0 {
		t.Errorf("after completion: waiting %g, want 0", got)
	}
	if got := metric(t, m, "vllm:e2e_request_latency_seconds"); got != 6 {
		t.Errorf("e2e histogram count %g, want 6", got)
	}
	if got := metric(t, m, "vllm:request_queue_time_seconds"); got != 6 {
		t.Errorf("queue histogram count %g, want 6", got)
	}
	// Queued requests waited at least one request's decode: 300 steps of ~7 ms of engine time.
	if q := m["vllm:request_queue_time_seconds"].sum; q < 1 {
		t.Errorf("total queue time %g engine seconds, want >= 1", q)
	}
	if got := metric(t, m, "vllm:generation_tokens_total"); got != 6*300 {
		t.Errorf("generation tokens %g, want 1800", got)
	}
}

func TestMetricsFlavors(t *testing.T) {
	tests := []struct {
		flavor string
		want   []string
		info   string
		labels []string
	}{
		{FlavorVLLM, []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
			"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds",
			"vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
			"vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total"},
			"vllm:cache_config_info", []string{"block_size", "num_gpu_blocks"}},
		{FlavorSGLang, []string{"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
			"sglang:max_total_num_tokens", "sglang:cache_hit_rate", "sglang:cached_tokens_total",
			"sglang:time_to_first_token_seconds", "sglang:e2e_request_latency_seconds"},
			"sglang:cache_config_info", []string{"page_size", "num_pages"}},
	}
	for _, tt := range tests {
		t.Run(tt.flavor, func(t *testing.T) {
			s := start(t, Config{MetricsFlavor: tt.flavor, KVBlocks: 1000})
			p := words("mf", 100)
			for range 2 {
				if code, b := post(t, s.URL()+"/v1/completions", map[string]any{"prompt": p, "max_tokens": 3}); code != 200 {
					t.Fatalf("status %d: %s", code, b)
				}
			}
			m := scrape(t, s.URL())
			for _, name := range tt.want {
				metric(t, m, name)
				if got := m[name].labels["model_name"]; got != "m" {
					t.Errorf("%s: model_name %q, want m", name, got)
				}
			}
			if got := metric(t, m, tt.info); got != 1 {
				t.Errorf("%s = %g, want 1", tt.info, got)
			}
			if got := m[tt.info].labels[tt.labels[0]]; got != "16" {
				t.Errorf("%s %s = %q, want 16", tt.info, tt.labels[0], got)
			}
			if got := m[tt.info].labels[tt.labels[1]]; got != "1000" {
				t.Errorf("%s %s = %q, want 1000", tt.info, tt.labels[1], got)
			}
			if tt.flavor == FlavorVLLM {
				q, h := metric(t, m, "vllm:prefix_cache_queries_total"), metric(t, m, "vllm:prefix_cache_hits_total")
				if q == 0 || h == 0 || h > q {
					t.Errorf("prefix cache queries %g hits %g", q, h)
				}
				if got := m["vllm:num_requests_running"].labels["engine"]; got != "0" {
					t.Errorf("engine label %q, want 0", got)
				}
			} else if got := metric(t, m, "sglang:cache_hit_rate"); got <= 0 || got >= 1 {
				t.Errorf("cache hit rate %g, want in (0, 1)", got)
			}
		})
	}
}

func TestDisconnectFreesSlot(t *testing.T) {
	s := start(t, Config{MaxNumSeqs: 1, TimeScale: 0.05})
	body := `{"model":"m","prompt":"a long story","max_tokens":100000,"stream":true}`
	req, _ := http.NewRequest("POST", s.URL()+"/v1/completions", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q, %v", line, err)
	}
	resp.Body.Close() // the client goes away mid-stream
	wait.For(t, "the slot to be freed", func() bool {
		st := s.Stats()
		return st.Running == 0 && st.UsedBlocks == 0
	})
	code, b := post(t, s.URL()+"/v1/completions", map[string]any{"prompt": "next", "max_tokens": 2})
	if code != 200 {
		t.Errorf("next request: status %d: %s", code, b)
	}
	if got := s.Stats().Canceled; got != 1 {
		t.Errorf("canceled %d, want 1", got)
	}
}

func TestModelsHealthTokenize(t *testing.T) {
	s := start(t, Config{})
	resp, err := http.Get(s.URL() + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health: %v %v", resp, err)
	}
	resp.Body.Close()

	resp, err = http.Get(s.URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if models.Object != "list" || len(models.Data) != 1 || models.Data[0].ID != "m" ||
		models.Data[0].MaxModelLen != s.EngineConfig().MaxModelLen {
		t.Errorf("models %+v", models)
	}

	msgs := []map[string]any{{"role": "user", "content": "Hello there"}}
	tests := []struct {
		name string
		body map[string]any
		text string
		strs bool
	}{
		{"prompt", map[string]any{"model": "m", "prompt": "Hello there"}, "Hello there", false},
		{"prompt strs", map[string]any{"prompt": "Hello there", "return_token_strs": true}, "Hello there", true},
		{"messages", map[string]any{"model": "m", "messages": msgs},
			RenderChat([]Message{{Role: "user", Content: "Hello there"}}, true), false},
		{"messages no generation prompt", map[string]any{"messages": msgs, "add_generation_prompt": false},
			RenderChat([]Message{{Role: "user", Content: "Hello there"}}, false), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, b := post(t, s.URL()+"/tokenize", tt.body)
			if code != 200 {
				t.Fatalf("status %d: %s", code, b)
			}
			var r struct {
				Count       int      `json:"count"`
				MaxModelLen int      `json:"max_model_len"`
				Tokens      []uint32 `json:"tokens"`
				TokenStrs   []string `json:"token_strs"`
			}
			json.Unmarshal(b, &r)
			ids, strs := TokenizeStrs(tt.text)
			if r.Count != len(ids) || len(r.Tokens) != len(ids) || r.MaxModelLen != s.EngineConfig().MaxModelLen {
				t.Errorf("got %+v, want %d tokens", r, len(ids))
			}
			for i := range ids {
				if r.Tokens[i] != ids[i] {
					t.Fatalf("token %d: %d, want %d", i, r.Tokens[i], ids[i])
				}
			}
			if tt.strs != (r.TokenStrs != nil) || (tt.strs && strings.Join(r.TokenStrs, "|") != strings.Join(strs, "|")) {
				t.Errorf("token_strs %q", r.TokenStrs)
			}
		})
	}
}

func TestCloseFailsInFlight(t *testing.T) {
	s, err := Start(Config{Preset: "llama3-8b-h100", TimeScale: 1, Model: "m"}, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := postAsync(s.URL()+"/v1/completions", `{"prompt":"x","max_tokens":100000}`)
	wait.For(t, "the request to run", func() bool { return s.Stats().Running == 1 })
	t0 := time.Now()
	s.Close()
	if code := <-done; code != http.StatusServiceUnavailable && code != -1 {
		t.Errorf("in-flight request got %d, want 503 or a closed connection", code)
	}
	if d := time.Since(t0); d > 3*time.Second {
		t.Errorf("Close took %v", d)
	}
}

func TestHealthAfterStop(t *testing.T) {
	s, err := New(Config{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	get := func() int {
		resp, err := http.Get(srv.URL + "/health")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get(); got != 200 {
		t.Errorf("running: health %d, want 200", got)
	}
	cancel()
	<-done
	if got := get(); got != 503 {
		t.Errorf("stopped: health %d, want 503", got)
	}
	code, b := post(t, srv.URL+"/v1/completions", map[string]any{"prompt": "x", "max_tokens": 1})
	if code != 503 || !strings.Contains(string(b), "not running") {
		t.Errorf("stopped: completion %d %s, want 503", code, b)
	}
	s.Reset() // returns at once
}

package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Error kinds of Sample.Err, besides "http NNN" for a response status
// other than 200.
const (
	// ErrConnect is a request that got no response (refused, reset before
	// headers, DNS).
	ErrConnect = "connect"
	// ErrTimeout is a request that passed Config.RequestTimeout.
	ErrTimeout = "timeout"
	// ErrStream is a stream that broke or ended without [DONE], or carried
	// a chunk that is not JSON.
	ErrStream = "stream"
	// ErrCut is a request still running when the run's duration or context
	// ended.
	ErrCut = "cut"
	// ErrEncode is a request that could not be built.
	ErrEncode = "encode"
)

// Sample is one request as the client saw it. Latencies are in model time:
// wall time divided by Config.TimeScale.
type Sample struct {
	// ID and Session are the workload request's.
	ID, Session string
	// Sent is when the request went out, wall time from the run's start.
	Sent time.Duration
	// TTFT is from sending to the first chunk with content.
	TTFT time.Duration
	// ITL is the mean gap between content chunks (zero with fewer than
	// two).
	ITL time.Duration
	// E2E is from sending to [DONE].
	E2E time.Duration
	// Chunks is the number of content chunks received.
	Chunks int
	// PromptTokens, CachedTokens and OutputTokens are from the usage chunk
	// (usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens,
	// usage.completion_tokens); zero without one.
	PromptTokens, CachedTokens, OutputTokens int
	// Usage says whether the stream carried a usage chunk.
	Usage bool
	// Replica is the X-Kvrouter-Replica response header; empty when the
	// endpoint is not kvrouter.
	Replica string
	// Reason is the routing decision's reason and PredictedCached the
	// prompt tokens the router predicted cached (in its own estimate of
	// the prompt), from the X-Kvrouter-Decision response header; Reason is
	// empty and PredictedCached -1 when the endpoint sent none.
	Reason          string
	PredictedCached int
	// Err is empty for a request that completed, else its kind: ErrConnect,
	// ErrTimeout, ErrStream, ErrCut, ErrEncode or "http NNN".
	Err string
}

// OK reports whether the request completed.
func (s *Sample) OK() bool { return s.Err == "" }

// fill copies a stream's figures, converted to model time.
func (s *Sample) fill(st stream, scale float64) {
	model := func(d time.Duration) time.Duration { return time.Duration(float64(d) / scale) }
	s.TTFT, s.E2E, s.Chunks = model(st.first), model(st.end), st.chunks
	if st.chunks > 1 {
		s.ITL = model((st.last - st.first) / time.Duration(st.chunks-1))
	}
	s.Usage = st.usage
	s.PromptTokens, s.CachedTokens, s.OutputTokens = st.prompt, st.cached, st.output
	if !st.usage {
		s.OutputTokens = st.chunks
	}
}

// Totals sums a run's samples.
type Totals struct {
	// Requests is the number of samples; OK those that completed.
	Requests, OK int
	// PromptTokens and CachedTokens sum the usage of completed requests.
	PromptTokens, CachedTokens, OutputTokens int64
	// Errors counts failed requests by kind.
	Errors map[string]int
	// Replicas counts completed requests by Sample.Replica (empty key:
	// no header).
	Replicas map[string]int
}

// HitRate is CachedTokens / PromptTokens, 0..1 (zero without prompts).
func (t Totals) HitRate() float64 {
	if t.PromptTokens == 0 {
		return 0
	}
	return float64(t.CachedTokens) / float64(t.PromptTokens)
}

// Prefill is the prompt tokens the engines computed: prompt − cached.
func (t Totals) Prefill() int64 { return t.PromptTokens - t.CachedTokens }

// ErrorCount is the number of failed requests.
func (t Totals) ErrorCount() int { return t.Requests - t.OK }

// Totals sums r's samples.
func (r *Result) Totals() Totals {
	t := Totals{Errors: map[string]int{}, Replicas: map[string]int{}}
	for i := range r.Samples {
		s := &r.Samples[i]
		t.Requests++
		if !s.OK() {
			t.Errors[s.Err]++
			continue
		}
		t.OK++
		t.PromptTokens += int64(s.PromptTokens)
		t.CachedTokens += int64(s.CachedTokens)
		t.OutputTokens += int64(s.OutputTokens)
		t.Replicas[s.Replica]++
	}
	return t
}

// FirstModel returns the id of the first model base lists at /v1/models.
func FirstModel(ctx context.Context, c *http.Client, base string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return "", fmt.Errorf("models %s: %w", base, err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", fmt.Errorf("models %s: %w", base, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", fmt.Errorf("models %s: %w", base, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("models %s: status %d: %.200s", base, resp.StatusCode, b)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return "", fmt.Errorf("models %s: %w", base, err)
	}
	if len(list.Data) == 0 || list.Data[0].ID == "" {
		return "", fmt.Errorf("models %s: no model listed", base)
	}
	return list.Data[0].ID, nil
}

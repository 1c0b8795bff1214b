package emulator

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// start runs a replica on a random loopback port for the test.
func start(t *testing.T, cfg Config) *Server {
	t.Helper()
	if cfg.Preset == "" {
		cfg.Preset = "llama3-8b-h100"
	}
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 0.02
	}
	if cfg.Model == "" {
		cfg.Model = "m"
	}
	s, err := Start(cfg, "127.0.0.1:0")
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// post sends body as JSON and returns the status and the response body.
func post(t *testing.T, url string, body any) (int, []byte) {
	t.Helper()
	var b []byte
	switch v := body.(type) {
	case string:
		b = []byte(v)
	default:
		var err error
		if b, err = json.Marshal(body); err != nil {
			t.Fatal(err)
		}
	}
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatalf("post %s: %v", url, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s: %v", url, err)
	}
	return resp.StatusCode, out
}

// postAsync sends body as JSON in the background; the channel receives
// the status, or -1 if the request failed.
func postAsync(url, body string) <-chan int {
	done := make(chan int, 1)
	go func() {
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			done <- -1
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	return done
}

// testResponse decodes the parts of a completion or chunk the tests check.
type testResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func decodeResponse(t *testing.T, b []byte) testResponse {
	t.Helper()
	var r testResponse
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	if r.Usage == nil || r.Usage.PromptTokensDetails == nil {
		t.Fatalf("response without usage.prompt_tokens_details: %s", b)
	}
	return r
}

// testError is the OpenAI error body, decoded independently of apiError.
type testError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// decodeError decodes {"error": {...}}, failing the test if b is not JSON.
func decodeError(t *testing.T, b []byte) testError {
	t.Helper()
	var e struct {
		Error testError `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("error body is not JSON: %s", b)
	}
	return e.Error
}

// streamed is one SSE response: its raw data lines and when the first
// arrived.
type streamed struct {
	events []string      // payloads after "data: ", in order
	first  time.Duration // from sending the request to the first event
	resp   *http.Response
}

// streamPost sends a streaming request and reads every event, checking the
// SSE framing ("data: ...\n\n").
func streamPost(t *testing.T, url string, body any) streamed {
	t.Helper()
	b, _ := json.Marshal(body)
	t0 := time.Now()
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatalf("post %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		msg, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, msg)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Errorf("content type %q, want text/event-stream", ct)
	}
	out := streamed{resp: resp}
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if err == io.EOF && line == "" {
			break
		}
		if err != nil {
			t.Fatalf("read stream: %v", err)
		}
		if len(out.events) == 0 {
			out.first = time.Since(t0)
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || !strings.HasSuffix(data, "\n") {
			t.Fatalf("bad SSE line %q", line)
		}
		if blank, _ := r.ReadString('\n'); blank != "\n" {
			t.Fatalf("SSE event %q not followed by a blank line (got %q)", line, blank)
		}
		out.events = append(out.events, strings.TrimSuffix(data, "\n"))
	}
	return out
}

// scrape reads /metrics with the Prometheus text parser.
func scrape(t *testing.T, base string) map[string]*familyView {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse metrics: %v", err)
	}
	out := map[string]*familyView{}
	for name, f := range fams {
		v := &familyView{labels: map[string]string{}}
		for _, m := range f.Metric {
			switch {
			case m.Gauge != nil:
				v.value = m.Gauge.GetValue()
			case m.Counter != nil:
				v.value = m.Counter.GetValue()
			case m.Histogram != nil:
				v.value = float64(m.Histogram.GetSampleCount())
				v.sum = m.Histogram.GetSampleSum()
			}
			for _, l := range m.Label {
				v.labels[l.GetName()] = l.GetValue()
			}
		}
		out[name] = v
	}
	return out
}

// familyView is the single sample of a metric family (the histogram's
// count and sum for histograms) and its labels.
type familyView struct {
	value, sum float64
	labels     map[string]string
}

// metric returns the value of name, failing the test if it is absent.
func metric(t *testing.T, fams map[string]*familyView, name string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("metric %s missing", name)
	}
	return f.value
}

// words returns a prompt of n distinct-ish words (each one token), seeded
// by tag so different tags give different prompts.
func words(tag string, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "%s%d ", tag[:min(len(tag), 2)], i%1000)
	}
	return b.String()
}

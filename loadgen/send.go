package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/kvrouter/kvrouter/trace"
)

// Message is one chat message of a request body.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Messages renders r's prompt as chat messages. A request with a session
// is a conversation: its first system segments (zero means 1) are the
// system message and the segments after them alternate user, assistant,
// user, ... (for multi-turn-chat: every earlier question and answer, then
// the new question). A request without a session is one user message
// holding its whole prompt. A recording's request (r.Recorded: its segments
// are blocks of a few tokens, not turns) has its segments after the
// system message in one user message: a message per block would add the
// chat template's tokens to every block. Either way the text of equal
// leading segments renders to equal leading messages, so the prefix
// reuse of the workload reaches the engine.
func Messages(r *trace.Request, system int) []Message {
	if r.Session == "" {
		return []Message{{Role: "user", Content: string(r.AppendText(nil))}}
	}
	if system <= 0 {
		system = 1
	}
	system = min(system, len(r.Segments))
	var sys []byte
	for _, s := range r.Segments[:system] {
		sys = trace.AppendSegmentText(sys, s)
	}
	out := []Message{{Role: "system", Content: string(sys)}}
	if r.Recorded {
		var user []byte
		for _, s := range r.Segments[system:] {
			user = trace.AppendSegmentText(user, s)
		}
		if len(user) > 0 {
			out = append(out, Message{Role: "user", Content: string(user)})
		}
		return out
	}
	for k, s := range r.Segments[system:] {
		role := "user"
		if k%2 == 1 {
			role = "assistant"
		}
		out = append(out, Message{Role: role, Content: string(trace.AppendSegmentText(nil, s))})
	}
	return out
}

// chatBody is the request body sent.
type chatBody struct {
	Model         string    `json:"model"`
	Messages      []Message `json:"messages"`
	MaxTokens     int       `json:"max_tokens"`
	Stream        bool      `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	IgnoreEOS bool `json:"ignore_eos,omitempty"`
}

// body returns the JSON body for q.
func (r *runner) body(q *trace.Request) ([]byte, error) {
	b := chatBody{Model: r.cfg.Model, Messages: Messages(q, r.cfg.SystemSegments),
		MaxTokens: max(q.Output, 1), Stream: true, IgnoreEOS: r.cfg.IgnoreEOS}
	if r.cfg.MaxTokens > 0 {
		b.MaxTokens = min(b.MaxTokens, r.cfg.MaxTokens)
	}
	b.StreamOptions.IncludeUsage = true
	return json.Marshal(b)
}

// send sends q, reads its stream and returns its sample.
func (r *runner) send(ctx context.Context, q *trace.Request) Sample {
	s := Sample{ID: q.ID, Session: q.Session, Sent: time.Since(r.start), PredictedCached: -1}
	body, err := r.body(q)
	if err != nil {
		s.Err = ErrEncode
		return s
	}
	rctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, r.cfg.Target+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		s.Err = ErrEncode
		return s
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if q.Session != "" {
		req.Header.Set(r.cfg.SessionHeader, q.Session)
	}
	if r.cfg.IDHeader != "" {
		req.Header.Set(r.cfg.IDHeader, q.ID)
	}
	t0 := time.Now()
	resp, err := r.cfg.Client.Do(req)
	if err != nil {
		s.Err = kind(ctx, rctx, err, ErrConnect)
		return s
	}
	defer resp.Body.Close()
	s.Replica = resp.Header.Get(HeaderReplica)
	if reason, pred, ok := parseDecision(resp.Header.Get(HeaderDecision)); ok {
		s.Reason, s.PredictedCached = reason, pred
	}
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		s.Err = "http " + strconv.Itoa(resp.StatusCode)
		return s
	}
	st, err := readStream(resp.Body, t0)
	s.fill(st, r.cfg.TimeScale)
	if err != nil {
		s.Err = kind(ctx, rctx, err, ErrStream)
	}
	return s
}

// kind names the error of a request: "cut" if the run ended (its
// duration or context), "timeout" if the request's own deadline passed or
// the network timed out, else def.
func kind(run, req context.Context, err error, def string) string {
	switch {
	case run.Err() != nil:
		return ErrCut
	case req.Err() != nil:
		return ErrTimeout
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ErrTimeout
	}
	return def
}

// stream is what one SSE response carried.
type stream struct {
	first, last time.Duration // first and last content chunk, from sending
	end         time.Duration // [DONE] or the end of the body
	chunks      int           // content chunks
	prompt      int           // usage.prompt_tokens
	cached      int           // usage.prompt_tokens_details.cached_tokens
	output      int           // usage.completion_tokens, or chunks without usage
	usage, done bool
}

// chunk is the part of a stream chunk loadgen reads.
type chunk struct {
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		Text string `json:"text"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// errNoDone is a stream that ended without "data: [DONE]".
var errNoDone = errors.New("stream ended without [DONE]")

// readStream reads an SSE body sent at t0 until [DONE].
func readStream(body io.Reader, t0 time.Time) (stream, error) {
	var st stream
	br := bufio.NewReaderSize(body, 32<<10)
	for {
		line, err := br.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// A long line: gather it whole.
			rest, err2 := br.ReadBytes('\n')
			line, err = append(append([]byte(nil), line...), rest...), err2
		}
		if len(line) > 0 {
			if stop, perr := st.line(bytes.TrimRight(line, "\r\n"), time.Since(t0)); perr != nil || stop {
				st.end = time.Since(t0)
				return st, perr
			}
		}
		if err != nil {
			st.end = time.Since(t0)
			if err == io.EOF {
				return st, errNoDone
			}
			return st, err
		}
	}
}

// line handles one SSE line received at t; stop is true after [DONE].
func (st *stream) line(l []byte, t time.Duration) (stop bool, err error) {
	data, ok := bytes.CutPrefix(l, []byte("data:"))
	if !ok {
		return false, nil // blank separator, comment, event: or id:
	}
	data = bytes.TrimSpace(data)
	if string(data) == "[DONE]" {
		st.done = true
		return true, nil
	}
	var c chunk
	if err := json.Unmarshal(data, &c); err != nil {
		return false, fmt.Errorf("bad chunk %.80q: %w", data, err)
	}
	for _, ch := range c.Choices {
		if ch.Delta.Content == "" && ch.Text == "" {
			continue
		}
		if st.chunks == 0 {
			st.first = t
		}
		st.last = t
		st.chunks++
		break
	}
	if u := c.Usage; u != nil {
		st.usage = true
		st.prompt, st.output = u.PromptTokens, u.CompletionTokens
		if u.PromptTokensDetails != nil {
			st.cached = u.PromptTokensDetails.CachedTokens
		}
	}
	return false, nil
}

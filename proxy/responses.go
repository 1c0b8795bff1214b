package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/prefix"
)

// The Responses API (POST /v1/responses) is routed like a chat request:
// the body is read into the chat prompt the engine renders for it
// (prefix.ParseResponses), hashed and routed by the policy with its
// session, and forwarded unchanged. A request continuing an earlier
// response (previous_response_id) is the earlier request's messages and
// output, then its own input: the router keeps, for each response it
// routed, that history and the replica that served it (threads). The
// follow-up is hashed with the history in front, so its prefix is found
// where the earlier turn left it, and it goes to that replica only: an
// engine keeps its responses in its own memory (vLLM's response store),
// so no other replica could continue it. A response the router does not
// know (routed before a restart, or by another router) is routed on its
// own input.

// Bounds of the threads kept: responses, and bytes of their history (a
// history over a quarter of it is not kept, only its replica).
const (
	maxThreads     = 16384
	maxThreadBytes = 64 << 20
	// maxCapture is the most bytes of a response the router keeps to
	// read its id, output and usage: a non-streaming body, or the final
	// event of a stream.
	maxCapture = 1 << 20
)

// thread is a routed response a later request may continue.
type thread struct {
	history []prefix.Message // its messages without system ones, then its output
	replica string           // the replica (base URL) that holds it
	bytes   int
}

// threads keeps the responses routed, oldest dropped first past
// maxThreads or maxThreadBytes. mu guards all; the zero value is ready.
type threads struct {
	mu    sync.Mutex
	byID  map[string]*thread
	order []string
	bytes int
}

func (ts *threads) get(id string) (*thread, bool) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t, ok := ts.byID[id]
	return t, ok
}

func (ts *threads) put(id string, t *thread) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.byID == nil {
		ts.byID = map[string]*thread{}
	}
	if old, ok := ts.byID[id]; ok {
		ts.bytes -= old.bytes
	} else {
		ts.order = append(ts.order, id)
	}
	ts.byID[id] = t
	ts.bytes += t.bytes
	for len(ts.order) > 0 && (len(ts.byID) > maxThreads || ts.bytes > maxThreadBytes) {
		if old, ok := ts.byID[ts.order[0]]; ok {
			ts.bytes -= old.bytes
			delete(ts.byID, ts.order[0])
		}
		ts.order = ts.order[1:]
	}
}

// respCall is a Responses request's own state in its call.
type respCall struct {
	thread  prefix.Thread
	own     []prefix.Message // the request's messages, history included, without system ones
	replica string           // the replica the request must go to; "" for any
	capture respCapture
}

// serveResponses routes POST /v1/responses.
func (rt *Router) serveResponses(w http.ResponseWriter, r *http.Request) {
	c := rt.newCall(r, true)
	r = c.startSpan(r)
	defer c.finish(r.Context())
	body, ok := c.readBody(w, r)
	if !ok {
		return
	}
	p, th, err := rt.cfg.BodyLimits.ParseResponses(body)
	if err != nil {
		if errors.Is(err, prefix.ErrNoPrompt) {
			c.failParam(w, http.StatusBadRequest, errInvalidRequest, "missing_prompt", "input", err.Error())
			return
		}
		c.parseError(w, err)
		return
	}
	rc := &respCall{thread: th}
	if prev, ok := rt.threads.get(th.Previous); ok && th.Previous != "" {
		p.Messages = withHistory(p.Messages, th.Instructions, prev.history)
		rc.replica = prev.replica
	}
	for _, m := range p.Messages {
		if m.Role != "system" {
			rc.own = append(rc.own, m)
		}
	}
	c.prompt, c.resp = p, rc
	if c.admitRoute(w, r, p) {
		c.forward(w, r, body)
	}
}

// withHistory puts history after the instructions (the first message, if
// instructions) and before the input.
func withHistory(msgs []prefix.Message, instructions bool, history []prefix.Message) []prefix.Message {
	n := 0
	if instructions && len(msgs) > 0 {
		n = 1
	}
	out := make([]prefix.Message, 0, len(msgs)+len(history))
	out = append(out, msgs[:n]...)
	out = append(out, history...)
	return append(out, msgs[n:]...)
}

// exclude appends to ex every replica but the one the request must go
// to, if any.
func (rc *respCall) exclude(rt *Router, ex []int) []int {
	if rc == nil || rc.replica == "" {
		return ex
	}
	for i := range rt.st.bes.list() {
		if rt.name(i) != rc.replica && !contains(ex, i) {
			ex = append(ex, i)
		}
	}
	return ex
}

// wrap puts the capture between the upstream body and the tap, and says
// whether the tap reads it as SSE: never, a Responses stream having no
// [DONE] and its usage in its last event, which the capture reads.
func (rc *respCall) wrap(body io.ReadCloser, status int, sse bool) (io.ReadCloser, bool) {
	rc.capture = respCapture{body: body, sse: sse, ok: status == http.StatusOK}
	return &rc.capture, false
}

// finish reads the response the capture kept: the engine's usage for the
// call, and the thread a later request may continue.
func (rc *respCall) finish(c *call) {
	res, ok := rc.capture.result()
	if !ok {
		return
	}
	c.usage = fleet.Usage{PromptTokens: res.Usage.InputTokens, CachedTokens: -1, CompletionTokens: res.Usage.OutputTokens}
	if d := res.Usage.InputTokensDetails; d != nil {
		c.usage.CachedTokens = d.CachedTokens
	}
	if rc.thread.NoStore || res.ID == "" || c.replica < 0 {
		return
	}
	t := &thread{history: append([]prefix.Message(nil), rc.own...), replica: c.rt.name(c.replica)}
	for _, item := range res.Output {
		if item.Type != "message" {
			continue
		}
		var texts []string
		for _, part := range item.Content {
			if part.Type == "output_text" {
				texts = append(texts, part.Text)
			}
		}
		t.history = append(t.history, prefix.Message{Role: "assistant", Content: strings.Join(texts, "\n")})
	}
	for _, m := range t.history {
		t.bytes += len(m.Content) + len(m.ToolCalls) + len(m.Role) + len(m.Name) + len(m.ToolCallID) + 64
	}
	if t.bytes > maxThreadBytes/4 {
		// A chain this long is routed on its own input from here on; the
		// pin to its replica is kept.
		t.history, t.bytes = nil, 0
	}
	c.rt.threads.put(res.ID, t)
}

// respResult is what the router reads of a response object.
type respResult struct {
	ID     string `json:"id"`
	Output []struct {
		Type    string `json:"type"`
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage *struct {
		InputTokens        int `json:"input_tokens"`
		OutputTokens       int `json:"output_tokens"`
		InputTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"input_tokens_details"`
	} `json:"usage"`
}

// respCapture passes a Responses body through unchanged and keeps what
// result needs, at most maxCapture bytes of it: the whole body, or of a
// stream the last event that carries a whole response (response.completed
// or response.incomplete), read when its blank line arrives.
type respCapture struct {
	body io.ReadCloser
	sse  bool
	ok   bool   // a 200: anything else is an error body
	buf  []byte // the body, or the stream's current event
	over bool   // buf went past maxCapture: dropped
	last []byte // a stream's last final event's data
}

// Read implements io.Reader.
func (rc *respCapture) Read(p []byte) (int, error) {
	n, err := rc.body.Read(p)
	if n > 0 && rc.ok {
		rc.keep(p[:n])
	}
	return n, err
}

// Close implements io.Closer.
func (rc *respCapture) Close() error { return rc.body.Close() }

// keep adds b to what is kept.
func (rc *respCapture) keep(b []byte) {
	if !rc.sse {
		if len(rc.buf)+len(b) > maxCapture {
			rc.over = true
			return
		}
		rc.buf = append(rc.buf, b...)
		return
	}
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		line := b
		if i >= 0 {
			line = b[:i+1]
		}
		b = b[len(line):]
		if !rc.over {
			if len(rc.buf)+len(line) > maxCapture {
				rc.over = true
			} else {
				rc.buf = append(rc.buf, line...)
			}
		}
		if i >= 0 && (bytes.HasSuffix(rc.buf, []byte("\n\n")) || bytes.HasSuffix(rc.buf, []byte("\n\r\n")) || bytes.Equal(rc.buf, []byte("\n"))) {
			rc.endEvent()
		}
	}
}

// endEvent keeps the data of the event just read if it is a final one.
func (rc *respCapture) endEvent() {
	ev := rc.buf
	rc.buf, rc.over = rc.buf[:0], false
	if !bytes.Contains(ev, []byte(`"response.completed"`)) && !bytes.Contains(ev, []byte(`"response.incomplete"`)) {
		return
	}
	var data []byte
	for _, line := range bytes.Split(ev, []byte("\n")) {
		if d, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			data = append(data, bytes.TrimSpace(d)...)
		}
	}
	var head struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(data, &head) == nil && (head.Type == "response.completed" || head.Type == "response.incomplete") {
		rc.last = data
	}
}

// result decodes the response kept, if any.
func (rc *respCapture) result() (respResult, bool) {
	var res respResult
	raw := rc.buf
	if rc.sse {
		var ev struct {
			Response json.RawMessage `json:"response"`
		}
		if rc.last == nil || json.Unmarshal(rc.last, &ev) != nil {
			return res, false
		}
		raw = ev.Response
	} else if rc.over || !rc.ok {
		return res, false
	}
	if json.Unmarshal(raw, &res) != nil || res.Usage == nil {
		return res, false
	}
	return res, true
}

// passReplica is the replica a pass-through request goes to: for a
// stored response's own paths (GET or DELETE /v1/responses/{id}, its
// cancel), the replica that holds it while it is healthy; else the
// healthy replica with the fewest requests in flight.
func (rt *Router) passReplica(r *http.Request) int {
	if rest, ok := strings.CutPrefix(r.URL.Path, "/v1/responses/"); ok {
		id, _, _ := strings.Cut(rest, "/")
		if t, ok := rt.threads.get(id); ok {
			for i := range rt.st.bes.list() {
				if rt.name(i) == t.replica && rt.st.healthy(i) {
					return i
				}
			}
		}
	}
	return rt.anyHealthy(nil)
}

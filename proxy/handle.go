package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"

	"kvrouter/prefix"
	"kvrouter/route"
)

// Response headers every routed response carries.
const (
	// HeaderReplica names the replica (base URL) that served the response.
	HeaderReplica = "X-Kvrouter-Replica"
	// HeaderDecision summarises the decision: reason, predicted cached
	// tokens, cost total, request id.
	HeaderDecision = "X-Kvrouter-Decision"
)

// buffers are per-request scratch slices, pooled so that routing a request
// allocates little.
type buffers struct {
	hashes []prefix.Hash
	match  []int
	age    []time.Duration
	costs  []route.Cost
	snap   route.Snapshot
}

// call is one request's state from arrival to the end of its response. It
// travels in the request context; only the request's own goroutine (the
// handler, and ReverseProxy hooks it calls synchronously) touches it.
type call struct {
	rt      *Router
	id      string
	start   time.Time
	path    string
	prompt  *prefix.Prompt
	session string
	req     route.Request
	dec     route.Decision
	replica int   // current replica, -1 before routing
	failed  []int // replicas that failed before the first byte
	strip   bool  // the router injected include_usage; drop the usage chunk
	bufs    *buffers
	decide  time.Duration
	ticket  ticket
	tap     *tap
	status  int
	errCode string // router error code, if the router answered
	routed  bool   // a completion routed by the policy (not a pass-through)
}

type callKey struct{}

func callFrom(ctx context.Context) *call {
	c, _ := ctx.Value(callKey{}).(*call)
	return c
}

// serveCompletion routes POST /v1/chat/completions and /v1/completions.
func (rt *Router) serveCompletion(w http.ResponseWriter, r *http.Request) {
	c := &call{rt: rt, start: time.Now(), path: r.URL.Path, replica: -1, routed: true}
	defer c.finish(r.Context())
	body, ok := c.readBody(w, r)
	if !ok {
		return
	}
	p, err := prefix.Parse(body)
	if err != nil {
		c.parseError(w, err)
		return
	}
	c.prompt = p
	if p.Stream && !p.IncludeUsage && !bytes.Contains(body, []byte(`"stream_options"`)) {
		body = injectUsage(body)
		c.strip = true
	}
	c.session = r.Header.Get(rt.cfg.SessionHeader)
	if c.session == "" {
		c.session = p.User
	}
	if !c.route(w) {
		return
	}
	out := r.WithContext(context.WithValue(r.Context(), callKey{}, c))
	setBody(out, body)
	rt.rp.ServeHTTP(w, out)
}

// readBody reads the whole body once, answering 413 past the limit.
func (c *call) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, c.rt.cfg.MaxBodyBytes))
	if err == nil {
		return body, true
	}
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		c.fail(w, http.StatusRequestEntityTooLarge, errInvalidRequest, "request_too_large",
			fmt.Sprintf("request body is larger than %d bytes", tooBig.Limit))
	} else {
		c.fail(w, http.StatusBadRequest, errInvalidRequest, "body_read_error", "reading request body: "+err.Error())
	}
	return nil, false
}

func (c *call) parseError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, prefix.ErrNoModel):
		c.fail(w, http.StatusBadRequest, errInvalidRequest, "missing_model", "you must provide a model parameter")
	case errors.Is(err, prefix.ErrNoPrompt):
		c.fail(w, http.StatusBadRequest, errInvalidRequest, "missing_prompt", err.Error())
	default:
		c.fail(w, http.StatusBadRequest, errInvalidRequest, "invalid_json", err.Error())
	}
}

// fail answers with a router error.
func (c *call) fail(w http.ResponseWriter, status int, typ, code, msg string) {
	c.status, c.errCode = status, code
	c.rt.m.errors.WithLabelValues(code).Inc()
	writeError(w, status, typ, code, msg)
}

// injectUsage adds "stream_options":{"include_usage":true} as the body's
// first member; every other byte is left as it was.
func injectUsage(body []byte) []byte {
	i := bytes.IndexByte(body, '{')
	if i < 0 {
		return body
	}
	const ins = `"stream_options":{"include_usage":true}`
	rest := bytes.TrimLeft(body[i+1:], " \t\r\n")
	sep := ","
	if len(rest) > 0 && rest[0] == '}' {
		sep = ""
	}
	out := make([]byte, 0, len(body)+len(ins)+1)
	out = append(out, body[:i+1]...)
	out = append(out, ins...)
	out = append(out, sep...)
	return append(out, body[i+1:]...)
}

// setBody makes r carry body, replayable through GetBody.
func setBody(r *http.Request, body []byte) {
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}

// route hashes the prompt, picks a replica and commits the decision. It
// answers 503 itself when no replica can take the request.
func (c *call) route(w http.ResponseWriter) bool {
	rt := c.rt
	seq := rt.seq.Add(1)
	c.id = "kvr-" + strconv.FormatUint(rt.st.epoch, 36) + "-" + strconv.FormatUint(seq, 10)
	c.bufs = rt.pool.Get().(*buffers)
	b := c.bufs
	var tokens int
	b.hashes, tokens = rt.st.hash(c.prompt, b.hashes[:0])
	n := len(rt.names)
	b.match, b.age, b.costs = grow(b.match, n), grow(b.age, n), grow(b.costs, n)
	c.req = route.Request{
		ID: c.id, Hash: xxhash.Sum64String(c.id), Seq: seq - 1,
		Tokens: tokens, MaxTokens: c.prompt.MaxTokens, Blocks: len(b.hashes),
		Match: b.match, Age: b.age, Pinned: -1, Costs: b.costs[:0],
	}
	if c.session != "" {
		c.req.Session = xxhash.Sum64String(c.session)
	}
	c.req.PrefixKey = prefixKey(c.prompt)
	return c.pick(w)
}

// pick runs the policy over a fresh snapshot (excluding replicas that
// already failed this request) and commits the choice.
func (c *call) pick(w http.ResponseWriter) bool {
	rt, b := c.rt, c.bufs
	t0 := time.Now()
	rt.st.match(b.hashes, t0, b.match, b.age)
	rt.st.snapshot(&b.snap)
	for _, f := range c.failed {
		b.snap.Replicas[f].Healthy = false
	}
	if c.req.Session != 0 {
		c.req.Pinned = rt.st.pinned(c.req.Session, t0)
	}
	c.dec = rt.policy.Pick(&c.req, &b.snap)
	c.decide += time.Since(t0)
	if c.dec.Replica < 0 || c.dec.Replica >= len(rt.names) {
		if w != nil {
			writeUnavailable(w, rt.cfg.HealthInterval, "no healthy replica can take the request")
			c.status, c.errCode = http.StatusServiceUnavailable, "no_healthy_replica"
			rt.m.errors.WithLabelValues(c.errCode).Inc()
		}
		return false
	}
	c.replica = c.dec.Replica
	c.ticket = rt.st.commit(c, t0)
	rt.m.decide.Observe(c.decide.Seconds())
	return true
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// rewrite points the outgoing request at the call's replica.
func (rt *Router) rewrite(pr *httputil.ProxyRequest) {
	c := callFrom(pr.In.Context())
	if c == nil || c.replica < 0 {
		return
	}
	pr.SetURL(rt.urls[c.replica])
	pr.SetXForwarded()
	pr.Out.Header.Del("Accept-Encoding") // bytes pass through uncompressed
}

// modifyResponse stamps the routing headers and wraps the body in a tap.
func (rt *Router) modifyResponse(resp *http.Response) error {
	c := callFrom(resp.Request.Context())
	if c == nil {
		return nil
	}
	c.status = resp.StatusCode
	resp.Header.Set(HeaderReplica, rt.names[c.replica])
	if c.routed {
		resp.Header.Set(HeaderDecision, c.summary())
	}
	ct := resp.Header.Get("Content-Type")
	sse := len(ct) >= 17 && ct[:17] == "text/event-stream"
	c.tap = &tap{body: resp.Body, sse: sse, strip: c.strip && sse, onFirst: c.firstByte}
	resp.Body = c.tap
	return nil
}

// summary is the X-Kvrouter-Decision value.
func (c *call) summary() string {
	total := time.Duration(0)
	for _, k := range c.dec.Costs {
		if k.Replica == c.replica {
			total = k.Total
		}
	}
	s := "reason=" + c.dec.Reason + "; predicted-cached=" + strconv.Itoa(c.dec.Matched) +
		"; cost=" + strconv.FormatFloat(ms(total), 'f', 3, 64) + "ms; id=" + c.id
	if len(c.failed) > 0 {
		s += "; retried=" + strconv.Itoa(len(c.failed))
	}
	return s
}

// firstByte runs when the first response byte arrives from the upstream.
func (c *call) firstByte(at time.Time) {
	if c.routed && c.status < 300 {
		c.rt.st.firstToken(c, at)
	}
}

// errorHandler answers when no upstream response could be had.
func (rt *Router) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	c := callFrom(r.Context())
	if r.Context().Err() != nil {
		return // the client went away; nobody to answer
	}
	if c != nil && c.replica >= 0 {
		w.Header().Set(HeaderReplica, rt.names[c.replica])
		c.status, c.errCode = http.StatusBadGateway, "upstream_unreachable"
	}
	rt.m.errors.WithLabelValues("upstream_unreachable").Inc()
	rt.log.Warn("upstream error", "err", err, "path", r.URL.Path)
	writeError(w, http.StatusBadGateway, errUpstream, "upstream_unreachable", "no replica could be reached: "+err.Error())
}

// finish settles the call on every path: releases the replica's load,
// feeds health and calibration, records metrics, the decision and a log
// line. It runs once, when the handler returns (also when it panics with
// http.ErrAbortHandler after a mid-stream failure).
func (c *call) finish(ctx context.Context) {
	rt := c.rt
	end := time.Now()
	outcome := "ok"
	switch {
	case c.errCode != "":
		outcome = "error"
	case ctx.Err() != nil:
		outcome = "canceled"
	case c.tap != nil && c.tap.err != nil:
		outcome = "upstream-error"
	case c.status >= 500:
		outcome = "upstream-error"
	}
	if c.replica < 0 {
		rt.logRequest(c, outcome, end)
		return
	}
	actual, prompt := -1, -1
	var ttft time.Duration
	if c.tap != nil {
		if c.tap.hasUsage {
			actual, prompt = c.tap.usage.cached(), c.tap.usage.PromptTokens
		}
		if !c.tap.first.IsZero() {
			ttft = c.tap.first.Sub(c.start)
		}
	}
	rt.st.release(c, outcome, actual, end)
	if outcome == "upstream-error" && c.tap != nil && c.tap.err != nil {
		rt.st.passiveFailure(c.replica, end)
	}
	name := rt.names[c.replica]
	if c.routed {
		rt.m.requests.WithLabelValues(name, rt.policyName, c.dec.Reason).Inc()
		rt.m.predicted.WithLabelValues(name).Add(float64(c.dec.Matched))
		if actual >= 0 {
			rt.m.actual.WithLabelValues(name).Add(float64(actual))
		}
		if prompt >= 0 {
			rt.m.prompt.WithLabelValues(name).Add(float64(prompt))
		}
	}
	if ttft > 0 {
		rt.m.ttft.WithLabelValues(name).Observe(ttft.Seconds())
	}
	rt.m.e2e.WithLabelValues(name).Observe(end.Sub(c.start).Seconds())
	if c.routed {
		rt.decisions.add(c.record(outcome, actual, prompt, ttft, end))
	}
	rt.logRequest(c, outcome, end)
	if c.bufs != nil {
		rt.pool.Put(c.bufs)
		c.bufs = nil
	}
}

// record builds the decision record (copying what aliases pooled buffers).
func (c *call) record(outcome string, actual, prompt int, ttft time.Duration, end time.Time) Record {
	rec := Record{
		ID: c.id, At: c.start, Session: c.session, Policy: c.rt.policyName, Path: c.path,
		Tokens: c.req.Tokens, Blocks: c.req.Blocks,
		Candidates: candidates(c.dec.Costs, c.rt.names),
		Replica:    c.rt.names[c.replica], Reason: c.dec.Reason,
		PredictedCached: c.dec.Matched, ActualCached: actual, PromptTokens: prompt,
		DecideMS: ms(c.decide), TTFTMS: ms(ttft), E2EMS: ms(end.Sub(c.start)),
		Status: c.status, Outcome: outcome,
	}
	if c.prompt != nil {
		rec.Model, rec.Stream = c.prompt.Model, c.prompt.Stream
	}
	for _, f := range c.failed {
		rec.Failed = append(rec.Failed, c.rt.names[f])
	}
	return rec
}

func (rt *Router) logRequest(c *call, outcome string, end time.Time) {
	if !rt.log.Enabled(context.Background(), -4) {
		return
	}
	replica := ""
	if c.replica >= 0 {
		replica = rt.names[c.replica]
	}
	rt.log.Debug("request", "id", c.id, "path", c.path, "replica", replica,
		"reason", c.dec.Reason, "predicted_cached", c.dec.Matched, "status", c.status,
		"outcome", outcome, "retries", len(c.failed), "dur", end.Sub(c.start))
}

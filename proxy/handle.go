package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/hashing"
	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/sse"
)

// Response headers every routed response carries.
const (
	// HeaderReplica names the replica (base URL) that served the response.
	HeaderReplica = "X-Kvrouter-Replica"
	// HeaderDecision summarises the decision: reason, predicted cached
	// tokens, cost total, request id.
	HeaderDecision = "X-Kvrouter-Decision"
)

// Session sources, as Record.SessionSource names them: where the session
// id came from.
const (
	// SessionFromHeader: the configured request header (default X-Session-ID).
	SessionFromHeader = "header"
	// SessionFromUser: the OpenAI "user" field.
	SessionFromUser = "user"
	// SessionFromContent: the conversation's own content
	// (prefix.Prompt.ConversationKey: its messages up to the first user
	// message), for requests that carry no session id.
	SessionFromContent = "content"
)

// call is one request's state from arrival to the end of its response. It
// travels in the request context; only the request's own goroutine (the
// handler, and the ReverseProxy hooks it calls synchronously) touches it.
// A call is the request's own, as httputil.ReverseProxy keeps its state in
// locals; calls are pooled with their buffers (bufs, Router.pool), so that
// routing a request allocates little: finish returns it (recycle).
type call struct {
	rt         *Router
	id         string
	start      time.Time
	method     string
	path       string
	prompt     *prefix.Prompt
	session    string
	sessionSrc string
	freq       fleet.Request  // the request as the fleet routes it
	dec        route.Decision // the last decision
	replica    int            // current replica, -1 before routing
	strip      bool           // the router injected include_usage; drop the usage chunk
	decide     time.Duration
	sent       time.Time // when the current replica was chosen
	ticket     *fleet.Ticket
	tapped     bool // tap wraps the response body
	status     int
	errCode    string          // router error code, if the router answered
	routed     bool            // a completion routed by the policy (not a pass-through)
	pass       string          // a pass-through's matched Config.PassThrough prefix
	priority   int             // HeaderPriority
	headers    bool            // the client sees the X-Kvrouter-* headers (clientHeaders)
	published  <-chan struct{} // closed when the session's binding is in Redis (shared.go); nil: none written
	ctx        context.Context // the request's, while it is routed
	rec        uint64          // the decision record's sequence number; 0: none
	index      string          // the chosen replica's residency feed
	span       trace.Span      // the server span; nil when tracing is off
	// KV transfers (transfer.go): plain is a routed completion's body
	// before any kv_transfer_params, what a retry starts from; in the
	// client's headers, which the legs take Authorization and the trace
	// context from; pd the state of the prefill legs, made when a
	// decision first orders one (nil: none did).
	plain []byte
	in    http.Header
	pd    *pdState

	*bufs // borrowed from Router.pool until finish

	sloState // the request's SLO and how it fared (slo.go)

	resp *respCall // a Responses API request's own state (responses.go); nil for others

	// served is the endpoint the data plane reported served the request
	// (Pick.Served); empty: none reported. picked is set once a Pick
	// holds the call, which is then not pooled (its methods may run after
	// Done).
	served string
	picked bool

	bodyHeld int64 // bytes the body took from the router's budget (budget.go)

	// Outcome, set by finish.
	outcome string
	usage   fleet.Usage // the engine's, fields -1 when not reported
	ttft    time.Duration
	end     time.Time
}

// bufs are the buffers a call borrows from the router's pool, kept with
// their capacity from one request to the next. They are reset when
// borrowed, and returned by finish unless the upstream transport may
// still read the request body they hold (recycle).
type bufs struct {
	scratch
	failed []int   // the call's replicas that failed before the first byte
	skip   []int   // the prefill workers whose leg failed (transfer.go)
	excl   []int   // failed and skip: what a decision excludes
	tap    sse.Tap // the response body as the client reads it
	st     stream  // a routed stream's reader, its buffers kept
	rb     reqBody // the request body sent upstream

	// owner is the call borrowing the buffers; onFirst and onToken are
	// the tap's OnFirst and OnToken, made once per buffer set: a method
	// value of each call would allocate for every request.
	owner            *call
	onFirst, onToken func(time.Time)
}

// newBufs returns an empty buffer set.
func newBufs() *bufs {
	b := new(bufs)
	b.onFirst = func(at time.Time) { b.owner.firstByte(at) }
	b.onToken = func(at time.Time) { b.owner.token(at) }
	return b
}

// borrow resets b for c.
func (b *bufs) borrow(c *call) {
	b.scratch = b.scratch.reset()
	b.failed, b.skip = b.failed[:0], b.skip[:0]
	b.tap.Reset(keepBytes)
	b.st.reset()
	b.owner = c
}

// scratch is a call's buffers for its body and its decision.
type scratch struct {
	body  []byte
	inj   []byte // body with include_usage injected
	xbody []byte // body with kv_transfer_params added
	whole []byte // a non-streamed answer read whole (readWhole)
	hs    hashing.Scratch
	sc    fleet.Scratch // the decision: what the policy saw and chose
	hdr   []byte
}

// keepBytes is the largest body buffer a pooled call keeps for the next
// request: one large body does not hold its memory for good.
const keepBytes = 1 << 20

// reset empties the buffers, keeping their capacity up to keepBytes.
func (s scratch) reset() scratch {
	s.body, s.inj, s.xbody, s.whole, s.hdr = keep(s.body), keep(s.inj), keep(s.xbody), keep(s.whole), s.hdr[:0]
	return s
}

// keep returns b emptied, or nil if it is larger than keepBytes.
func keep(b []byte) []byte {
	if cap(b) > keepBytes {
		return nil
	}
	return b[:0]
}

// reqBody is the pooled request body sent upstream. It notes when the
// transport read it to the end, after which no read can come: only then
// may the call (and its body buffer) be reused.
type reqBody struct {
	r   bytes.Reader
	eof atomic.Bool
}

// Read implements io.Reader.
func (b *reqBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		b.eof.Store(true)
	}
	return n, err
}

// Close does nothing: the bytes belong to the call.
func (b *reqBody) Close() error { return nil }

type callKey struct{}

func callFrom(ctx context.Context) *call {
	c, _ := ctx.Value(callKey{}).(*call)
	return c
}

// newCall starts a request's call, from the pool.
func (rt *Router) newCall(r *http.Request, routed bool) *call {
	c := rt.pool.Get().(*call)
	*c = call{
		rt: rt, start: rt.now(), method: r.Method, path: r.URL.Path, replica: -1, routed: routed, usage: fleet.NoUsage,
		headers: rt.clientHeaders(r.Context()), bufs: c.bufs,
	}
	c.borrow(c)
	return c
}

// serveCompletion routes POST /v1/chat/completions and /v1/completions.
func (rt *Router) serveCompletion(w http.ResponseWriter, r *http.Request) {
	c := rt.newCall(r, true)
	r = c.startSpan(r)
	defer c.finish(r.Context())
	body, ok := c.readBody(w, r)
	if !ok {
		return
	}
	p, err := rt.cfg.BodyLimits.Parse(body)
	if err != nil {
		c.parseError(w, err)
		return
	}
	c.prompt = p
	if !c.ownParams(w, body) {
		return
	}
	if p.Stream && !p.IncludeUsage {
		c.inj = appendInjectUsage(c.inj[:0], body, p)
		body, c.strip = c.inj, true
	}
	c.sessionOf(r, p)
	if c.priority, ok = priorityOf(r); !ok {
		c.fail(w, http.StatusBadRequest, errInvalidRequest, "invalid_priority", HeaderPriority+" must be an integer within ±1000")
		return
	}
	if !c.setSLO(w, r) {
		return
	}
	c.ctx, c.in = r.Context(), r.Header
	if !c.route(w) {
		return
	}
	if body, ok = c.disaggregate(w, c.xbody[:0], body); !ok {
		return
	}
	if c.transfer().Blocks > 0 {
		c.xbody = body
	}
	out := r.WithContext(context.WithValue(r.Context(), callKey{}, c))
	c.setBody(out, body)
	rt.rp.ServeHTTP(w, out)
}

// sessionOf finds the request's session id: the configured header, else
// the OpenAI user field, else a key of the conversation's own content. An
// id longer than fleet.MaxSessionIDBytes is kept as its hash
// (fleet.SessionKey), so that its size is bounded wherever it is kept.
func (c *call) sessionOf(r *http.Request, p *prefix.Prompt) {
	switch {
	case r.Header.Get(c.rt.cfg.SessionHeader) != "":
		c.session, c.sessionSrc = fleet.SessionKey(r.Header.Get(c.rt.cfg.SessionHeader)), SessionFromHeader
	case p.User != "":
		c.session, c.sessionSrc = fleet.SessionKey(p.User), SessionFromUser
	default:
		var b [24]byte
		c.session, c.sessionSrc = string(strconv.AppendUint(append(b[:0], "conv-"...), p.ConversationKey(), 16)), SessionFromContent
	}
}

// readBody reads the whole body once into the call's buffer, answering
// 413 past the limit (at once when the declared Content-Length is past
// it) and 408 when the body does not arrive within the body timeout
// (NewServer). The buffer grows as bytes arrive (readGrowing), never to
// the declared length: a client that declares 8 MB and sends 1 KB costs
// about 1 KB.
func (c *call) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	limit := c.rt.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		c.tooLarge(w, limit)
		return nil, false
	}
	in := c.takeBody(w, r) // budget.go
	if in == nil {
		return nil, false
	}
	var err error
	c.body, err = readGrowing(http.MaxBytesReader(w, io.NopCloser(in), limit), c.body[:0], r.ContentLength)
	if err == nil {
		return c.body, true
	}
	var tooBig *http.MaxBytesError
	switch {
	case errors.Is(err, errBodyBudget):
		c.overBudget(w)
	case errors.As(err, &tooBig):
		c.tooLarge(w, tooBig.Limit)
	case errors.Is(err, os.ErrDeadlineExceeded):
		w.Header().Set("Connection", "close")
		c.fail(w, http.StatusRequestTimeout, errInvalidRequest, "body_timeout",
			fmt.Sprintf("request body not received within %s", c.rt.cfg.bodyTimeout()))
	default:
		c.fail(w, http.StatusBadRequest, errInvalidRequest, "body_read_error", "reading request body: "+err.Error())
	}
	return nil, false
}

// readGrowing appends what r yields to buf until EOF, doubling the buffer
// whenever it is full, from 4 KiB: it is at most twice what has arrived.
// A doubling never goes past declared+1 bytes (declared > 0, a body's
// Content-Length, one more to see EOF without growing again), so that a
// body of the length it declares ends in a buffer its own size.
func readGrowing(r io.Reader, buf []byte, declared int64) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			n := max(2*cap(buf), 4<<10)
			if declared > 0 && int64(n) > declared+1 && declared+1 > int64(len(buf)) {
				n = int(declared + 1)
			}
			buf = append(make([]byte, 0, n), buf...)
		}
		m, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		switch {
		case err == io.EOF:
			return buf, nil
		case err != nil:
			return buf, err
		}
	}
}

func (c *call) tooLarge(w http.ResponseWriter, limit int64) {
	c.fail(w, http.StatusRequestEntityTooLarge, errInvalidRequest, "request_too_large",
		fmt.Sprintf("request body is larger than %d bytes", limit))
}

func (c *call) parseError(w http.ResponseWriter, err error) {
	if c.limitError(w, err) {
		return
	}
	code, param, msg := parseErrorOf(err, c.path)
	c.failParam(w, http.StatusBadRequest, errInvalidRequest, code, param, msg)
}

// fail answers with a router error.
func (c *call) fail(w http.ResponseWriter, status int, typ, code, msg string) {
	c.failParam(w, status, typ, code, "", msg)
}

// failParam answers with a router error naming the request field at
// fault, param ("": none).
func (c *call) failParam(w http.ResponseWriter, status int, typ, code, param, msg string) {
	c.status, c.errCode = status, code
	c.rt.m.errors.WithLabelValues(code).Inc()
	writeParamError(w, status, typ, code, param, msg)
}

// appendInjectUsage appends to dst the body of p with
// stream_options.include_usage set to true, every other byte as it was:
// stream_options is added as the body's first member when absent, an
// object without include_usage gets it as its first member, and a null
// stream_options or a false or null include_usage is replaced.
func appendInjectUsage(dst, body []byte, p *prefix.Prompt) []byte {
	const usage = `"include_usage":true`
	at, with := p.StreamOptionsAt, "{"+usage+"}"
	switch {
	case p.IncludeUsageAt != [2]int{}:
		at, with = p.IncludeUsageAt, "true"
	case at == [2]int{}: // absent: a new first member
		i := bytes.IndexByte(body, '{')
		if i < 0 {
			return append(dst, body...)
		}
		at, with = [2]int{i + 1, i + 1}, `"stream_options":{`+usage+`}`
		if rest := bytes.TrimLeft(body[i+1:], " \t\r\n"); len(rest) > 0 && rest[0] != '}' {
			with += ","
		}
	case body[at[0]] == '{': // an object without include_usage
		at, with = [2]int{at[0] + 1, at[0] + 1}, usage
		if rest := bytes.TrimLeft(body[at[0]:], " \t\r\n"); len(rest) > 0 && rest[0] != '}' {
			with += ","
		}
	}
	dst = append(dst, body[:at[0]]...)
	dst = append(dst, with...)
	return append(dst, body[at[1]:]...)
}

// setBody makes r carry body (from the call's reusable reader),
// replayable through GetBody.
func (c *call) setBody(r *http.Request, body []byte) {
	c.rb.r.Reset(body)
	r.Body = &c.rb
	r.ContentLength = int64(len(body))
	r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
}

// route hashes the prompt, picks a replica and commits the decision. It
// answers itself when no replica can take the request: 404 for a model no
// replica serves, 503 when none of those serving it is healthy, and 503
// no_replica, never 404, while the fleet is empty.
func (c *call) route(w http.ResponseWriter) bool {
	rt := c.rt
	fl := rt.st.fleet
	var id [64]byte
	c.id = string(strconv.AppendUint(append(id[:0], rt.idPrefix...), rt.seq.Add(1), 10))
	p := c.prompt
	if !fl.Serves(p.Model) && fl.Serving() > 0 {
		if w != nil {
			c.failParam(w, http.StatusNotFound, errInvalidRequest, codeModelNotFound, "model", "The model `"+p.Model+"` does not exist.")
		}
		return false
	}
	var sizes []int
	if rt.st.hasher.Engine() {
		sizes = fl.BlockSizes()
	}
	chains, tokens := rt.st.hasher.Hash(p, prefix.Root(fl.ModelKey(p.Model)), sizes, &c.hs)
	c.freq = fleet.Request{
		ID: c.id, Hash: xxhash.Sum64String(c.id), Model: p.Model, Session: c.session,
		Tokens: tokens, MaxTokens: p.MaxTokens, PrefixKey: p.PrefixKey(), Chains: chains, TTFT: p.Stream, SLO: c.slo,
	}
	c.readSession()
	return c.pick(w)
}

// pick lets the fleet decide over a fresh snapshot (excluding replicas
// that already failed this request): the policy picks, the fleet commits
// the choice (load, session binding, residency) and the decision is
// recorded. The fleet applies --slo-admission (fleet.Admission.SLO): a
// request it refuses for its predicted SLO miss is queued or answered
// 429 here.
func (c *call) pick(w http.ResponseWriter) bool {
	rt := c.rt
	c.freq.Admitted = c.rec != 0 // a retry: its first decision admitted it
	t0 := c.decideNow()
	if c.ticket == nil && c.dec.Reason == route.ReasonSaturated && w != nil {
		var ok bool
		if t0, ok = c.queue(c.ctx, w, c.priority); !ok {
			return false
		}
	}
	if c.ticket == nil && c.dec.Reason == route.ReasonNoHealthy && w != nil {
		t0 = c.holdForReplica(t0) // panic.go
	}
	if c.ticket == nil && c.dec.Reason == route.ReasonUnattainable && w != nil {
		var ok bool
		if t0, ok = c.admitSLO(w); !ok {
			return false
		}
	}
	c.routedSLO()
	if c.ticket == nil {
		if w != nil {
			c.status, c.errCode = http.StatusServiceUnavailable, rt.writeNoReplica(w)
			rt.m.errors.WithLabelValues(c.errCode).Inc()
			c.record()
		}
		return false
	}
	c.replica, c.sent = c.dec.Replica, t0
	c.countPanic()
	c.writeSession()
	c.index = rt.st.fleet.IndexMode(c.replica)
	rt.m.decide.Observe(c.decide.Seconds())
	c.record()
	return true
}

// decideNow lets the fleet decide the call now and returns when.
func (c *call) decideNow() time.Time {
	t0 := c.rt.now()
	c.dec, c.ticket = c.rt.st.fleet.Decide(&c.freq, c.exclude(), t0, &c.sc)
	c.decide += c.rt.now().Sub(t0)
	return t0
}

// exclude is what the call's decisions exclude: the replicas that failed
// it and the prefill workers whose leg failed.
func (c *call) exclude() []int {
	if len(c.skip) == 0 && c.resp == nil {
		return c.failed
	}
	c.excl = append(append(c.excl[:0], c.failed...), c.skip...)
	c.excl = c.resp.exclude(c.rt, c.excl)
	return c.excl
}

// rewrite points the outgoing request at the call's replica.
func (rt *Router) rewrite(pr *httputil.ProxyRequest) {
	c := callFrom(pr.In.Context())
	if c == nil || c.replica < 0 {
		return
	}
	pr.SetURL(rt.url(c.replica))
	rt.setForwarded(pr)
	pr.Out.Header.Del("Accept-Encoding") // bytes pass through uncompressed
}

// setForwarded sets the X-Forwarded-* headers. From a peer in
// TrustedProxies, the client's X-Forwarded-For is kept and the peer
// appended, its X-Forwarded-Host, X-Forwarded-Proto, other X-Forwarded-*
// and X-Real-IP pass on; from any other peer, those are dropped and
// X-Forwarded-For and -Proto are the router's own (the peer's address,
// http or https), with no X-Forwarded-Host: the Host such a peer sends is
// its own word, which a replica must not take for the router's.
// ReverseProxy has already removed X-Forwarded-For, -Host, -Proto and
// Forwarded from pr.Out.
func (rt *Router) setForwarded(pr *httputil.ProxyRequest) {
	in, out := pr.In.Header, pr.Out.Header
	if !rt.trusted(pr.In.RemoteAddr) {
		for k := range out {
			if strings.HasPrefix(k, "X-Forwarded-") || k == "X-Real-Ip" {
				delete(out, k)
			}
		}
		pr.SetXForwarded()
		out.Del("X-Forwarded-Host")
		return
	}
	out["X-Forwarded-For"] = in["X-Forwarded-For"]
	pr.SetXForwarded()
	for _, k := range []string{"X-Forwarded-Host", "X-Forwarded-Proto"} {
		if v := in[k]; len(v) > 0 {
			out[k] = v
		}
	}
}

// trusted reports whether the peer at remoteAddr (host:port) is in
// TrustedProxies.
func (rt *Router) trusted(remoteAddr string) bool {
	if len(rt.cfg.TrustedProxies) == 0 {
		return false
	}
	ap, err := netip.ParseAddrPort(remoteAddr)
	return err == nil && rt.cfg.TrustedProxies.Contains(ap.Addr())
}

// modifyResponse stamps the routing headers and wraps the body in a tap.
func (rt *Router) modifyResponse(resp *http.Response) error {
	c := callFrom(resp.Request.Context())
	if c == nil {
		return nil
	}
	c.status = resp.StatusCode
	reshapeError(resp)
	if !c.headers {
		stripRouting(resp.Header) // an upstream's own (a router behind this one) too
	} else {
		resp.Header.Set(HeaderReplica, rt.name(c.replica))
		if c.routed {
			resp.Header.Set(HeaderDecision, c.summary())
		}
	}
	ct := resp.Header.Get("Content-Type")
	sse := len(ct) >= 17 && ct[:17] == "text/event-stream"
	if c.resp != nil {
		resp.Body, sse = c.resp.wrap(resp.Body, resp.StatusCode, sse)
	}
	c.tap.Body, c.tap.SSE, c.tap.Strip, c.tap.OnFirst, c.tap.Now = resp.Body, sse, c.strip && sse, c.onFirst, rt.now
	c.tap.OnToken = c.onToken
	c.tap.Framed = sse && resp.Body == io.ReadCloser(&c.st) // the stream showed the tap its events
	c.tapped = true
	resp.Body = &c.tap
	return nil
}

// summary is the X-Kvrouter-Decision value.
func (c *call) summary() string {
	var chosen route.Cost
	for _, k := range c.dec.Costs {
		if k.Replica == c.replica {
			chosen = k
		}
	}
	b := append(c.hdr[:0], "reason="...)
	b = append(b, c.dec.Reason...)
	b = append(b, "; predicted-cached="...)
	b = strconv.AppendInt(b, int64(c.dec.Matched), 10)
	switch {
	case chosen.Total != 0:
		b = append(b, "; cost="...)
		b = strconv.AppendFloat(b, ms(chosen.Total), 'f', 3, 64)
		b = append(b, "ms"...)
	case chosen.Score != 0:
		b = append(b, "; score="...)
		b = strconv.AppendFloat(b, chosen.Score, 'g', 6, 64)
	} // a policy that prices nothing (round-robin) says neither
	b = append(b, "; session="...)
	b = append(b, c.sessionSrc...)
	b = append(b, "; id="...)
	b = append(b, c.id...)
	b = c.appendTransfer(b)
	if len(c.failed) > 0 {
		b = append(b, "; retried="...)
		b = strconv.AppendInt(b, int64(len(c.failed)), 10)
	}
	c.hdr = b
	return string(b)
}

// errorHandler answers when no upstream response could be had.
func (rt *Router) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	c := callFrom(r.Context())
	if r.Context().Err() != nil {
		return // the client went away; nobody to answer
	}
	if c != nil && c.replica >= 0 {
		if c.headers {
			w.Header().Set(HeaderReplica, rt.name(c.replica))
		}
		c.status, c.errCode = http.StatusBadGateway, "upstream_unreachable"
	}
	rt.m.errors.WithLabelValues("upstream_unreachable").Inc()
	rt.log.Warn("upstream error", "err", err, "path", r.URL.Path)
	writeError(w, http.StatusBadGateway, errUpstream, "upstream_unreachable", "no replica could be reached: "+err.Error())
}

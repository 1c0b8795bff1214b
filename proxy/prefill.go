package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/route"
)

// The prefill leg of a disaggregated request, and the release of what
// it holds when no decode leg follows (transfer.go has the protocol).

// maxLegAnswer bounds the bytes of a prefill leg's answer the router
// reads: a one-token completion and its kv_transfer_params.
const maxLegAnswer = 1 << 20

// defaultReleaseTimeout bounds a release without Config.TTFTTimeout.
const defaultReleaseTimeout = time.Minute

// nullParams are the kv_transfer_params of a prefill leg, as vLLM's
// proxy sends them: the worker computes the prompt and keeps its blocks
// for a remote decode.
var nullParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

var (
	// errOwnParams: the client's body carries its own kv_transfer_params.
	errOwnParams = errors.New("the request has its own kv_transfer_params")
	// errNoParams: a prefill leg answered without usable params.
	errNoParams = errors.New("the prefill leg's answer has no kv_transfer_params")
)

// pdState is the prefill/decode state of a call whose decision ordered a
// prefill leg: the transfer the forwarded body runs, xfer (Blocks 0:
// none), of xferTokens tokens, with params, the prefill leg's
// kv_transfer_params; pbody the prefill legs' body (nil: none built
// yet), own whether the client's body has its own params (no legs); legs
// counts the prefill legs run, leg is the last. Only a call that runs a
// leg has one (call.pd), so that every other request neither allocates
// nor carries it.
type pdState struct {
	xfer       route.Transfer
	xferTokens int
	params     []byte
	pbody      []byte
	own        bool
	legs       int
	leg        legState
}

// transfer is the transfer the call's forwarded body runs (Blocks 0:
// none).
func (c *call) transfer() route.Transfer {
	if c.pd == nil {
		return route.Transfer{}
	}
	return c.pd.xfer
}

// legRan returns the call's prefill-leg state when it ran a leg, else
// nil.
func (c *call) legRan() *pdState {
	if c.pd == nil || c.pd.legs == 0 {
		return nil
	}
	return c.pd
}

// legState is the last prefill leg of a call: the replica that ran it,
// how long it took, how it ended (legOK, ...) and the prompt tokens its
// answer's usage reported (0: none).
type legState struct {
	from    int
	took    time.Duration
	outcome string
	prompt  int
}

// oneToken returns the body of a one-token, non-streaming request with
// params as its kv_transfer_params, from plain, the request's own body:
// what vLLM's proxy sends a prefill worker (toy_proxy_server.py,
// send_request_to_service), and what a release sends a decode worker.
// "stream" is false, "max_tokens" 1 and "max_completion_tokens" 1 when
// present; stream_options, min_tokens and min_completion_tokens are
// dropped. It fails with errOwnParams when plain has kv_transfer_params.
func oneToken(plain, params []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(plain, &m); err != nil {
		return nil, err
	}
	if _, ok := m["kv_transfer_params"]; ok {
		return nil, errOwnParams
	}
	one := json.RawMessage("1")
	m["kv_transfer_params"], m["stream"], m["max_tokens"] = params, json.RawMessage("false"), one
	if _, ok := m["max_completion_tokens"]; ok {
		m["max_completion_tokens"] = one
	}
	delete(m, "stream_options")
	delete(m, "min_tokens")
	delete(m, "min_completion_tokens")
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // the prompt's bytes as the client wrote them
	if err := enc.Encode(m); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// legBody makes the call's prefill-leg body, once, and reports whether
// the request may run legs: not when its body has its own
// kv_transfer_params.
func (c *call) legBody(plain []byte) bool {
	if c.pd == nil {
		c.pd = new(pdState)
	}
	pd := c.pd
	if pd.pbody != nil {
		return true
	}
	if pd.own {
		return false
	}
	b, err := oneToken(plain, nullParams)
	if err != nil {
		pd.own = true
		c.rt.log.Debug("no kv transfer legs", "id", c.id, "err", err)
		return false
	}
	pd.pbody = b
	return true
}

// prefill runs a prefill leg on replica from and returns the params its
// answer carries, with the leg's outcome: charged to the replica in the
// fleet while it runs, fed to its passive health, counted, traced and
// recorded.
func (c *call) prefill(from int) ([]byte, string) {
	rt := c.rt
	c.pd.legs++
	start := rt.now()
	tk := c.chargeLeg(from, start)
	ctx, cancel := c.legContext()
	defer cancel()
	ctx, span := c.startLeg(ctx, from)
	params, prompt, err := c.sendLeg(ctx, from)
	outcome := legOutcome(ctx, err)
	end := rt.now()
	c.pd.leg = legState{from: from, took: end.Sub(start), outcome: outcome, prompt: prompt}
	c.settleLeg(tk, end, err)
	endLeg(span, outcome, err)
	c.record()
	return params, outcome
}

// settleLeg releases the last leg's ticket tk at end, feeds its worker's
// passive health (a refused connection ejects it) and counts the leg.
func (c *call) settleLeg(tk *fleet.Ticket, end time.Time, err error) {
	rt, from, outcome := c.rt, c.pd.leg.from, c.pd.leg.outcome
	switch outcome {
	case legOK:
		tk.Done(end, fleet.NoUsage, nil)
		rt.st.reportSuccess(from)
	case legError, legTimeout, legBadParams:
		tk.Done(end, fleet.NoUsage, errUpstreamFailed)
		if isDialError(err) {
			rt.st.eject(from, err.Error())
		} else {
			rt.st.reportFailure(from)
		}
	default: // an answer without params: not the worker's failure
		tk.Done(end, fleet.NoUsage, nil)
	}
	rt.xm.legs.WithLabelValues(legPrefill, outcome).Inc()
	if err != nil {
		rt.log.Warn("prefill leg failed", "id", c.id, "prefill", rt.name(from), "outcome", outcome, "err", err)
	}
}

// chargeLeg charges a prefill leg to replica from in the fleet: the
// prompt, less what the index matched there, and one output token.
func (c *call) chargeLeg(from int, now time.Time) *fleet.Ticket {
	cached := 0
	if m := c.seen().Request.Match; from < len(m) {
		cached = m[from] * max(c.seen().Snapshot.BlockSize, 1)
	}
	tk, err := c.rt.st.fleet.Acquire(c.rt.name(from), fleet.LegClaim(c.freq.Tokens, cached), now)
	if err != nil {
		return nil // removed meanwhile: nothing to charge
	}
	return tk
}

// legContext is a prefill leg's context: the request's values without
// its cancellation, within the leg timeout (Config.LegTimeout, else the
// TTFT timeout: the leg is a prefill and one token) and what is left of
// the request timeout. A leg runs to its end or its timeout when the
// client goes away meanwhile: a worker that finished the prompt just
// before it heard of an abort would hold blocks nobody knows of, while
// blocks the router knows of it can release.
func (c *call) legContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithoutCancel(c.ctx), context.CancelFunc(func() {})
	if d := c.rt.cfg.legTimeout(); d > 0 {
		ctx, cancel = context.WithTimeout(ctx, d)
	}
	if d := c.rt.cfg.RequestTimeout; d > 0 {
		inner, cancelInner := context.WithDeadline(ctx, c.start.Add(d))
		outer := cancel
		return inner, func() { cancelInner(); outer() }
	}
	return ctx, cancel
}

// sendLeg posts the prefill-leg body to replica from and returns the
// kv_transfer_params of its answer, checked (legparams.go), and the
// prompt tokens its usage reported.
func (c *call) sendLeg(ctx context.Context, from int) ([]byte, int, error) {
	u := c.rt.url(from)
	peer := legPeer{host: u.Hostname()}
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) {
		if a, ok := ci.Conn.RemoteAddr().(*net.TCPAddr); ok {
			peer.addr = a.IP.String()
		}
	}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.JoinPath(c.path).String(), bytes.NewReader(c.pd.pbody))
	if err != nil {
		return nil, 0, err
	}
	c.legHeaders(req.Header)
	resp, err := c.rt.upstream.RoundTrip(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxLegAnswer+1))
	switch {
	case resp.StatusCode != http.StatusOK:
		return nil, 0, fmt.Errorf("prefill leg answered %s", resp.Status)
	case err != nil:
		return nil, 0, err
	case len(b) > maxLegAnswer:
		return nil, 0, fmt.Errorf("%w: an answer larger than %d bytes", errNoParams, maxLegAnswer)
	}
	params, prompt, err := paramsOf(b)
	if err != nil {
		return nil, 0, err
	}
	if err := checkParams(params, 2*c.freq.Tokens, paramRules{answer: true, host: peer.check}); err != nil { // the router's estimate, not the worker's word, with room for its error
		return nil, 0, err
	}
	return params, prompt, nil
}

// legHeaders are the headers of the requests the router makes itself for
// a call: JSON, the router's request id as X-Request-Id (as vLLM's proxy
// sends it on both legs), and of the client's the Authorization, which
// the router forwards, and the W3C trace context, which it passes on
// when it does not trace (with tracing on, the leg's span replaces it).
func (c *call) legHeaders(h http.Header) {
	h.Set("Content-Type", "application/json")
	h.Set("X-Request-Id", c.id)
	for _, k := range []string{"Authorization", "Traceparent", "Tracestate"} {
		if v := c.in.Get(k); v != "" {
			h.Set(k, v)
		}
	}
}

// paramsOf returns the top-level kv_transfer_params of a prefill leg's
// answer, verbatim (a JSON object with at least one member), and the
// prompt tokens its usage reported.
func paramsOf(answer []byte) ([]byte, int, error) {
	var a struct {
		Params json.RawMessage `json:"kv_transfer_params"`
		Usage  struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(answer, &a); err != nil {
		return nil, 0, fmt.Errorf("%w: %v", errNoParams, err)
	}
	p := bytes.TrimSpace(a.Params)
	if len(p) < 2 || p[0] != '{' || len(bytes.TrimSpace(p[1:len(p)-1])) == 0 {
		return nil, 0, errNoParams
	}
	return p, a.Usage.PromptTokens, nil
}

// legOutcome classifies a prefill leg's error; ctx is the leg's.
func legOutcome(ctx context.Context, err error) string {
	var ne net.Error
	switch {
	case err == nil:
		return legOK
	case errors.Is(err, errNoParams):
		return legNoParams
	case errors.Is(err, errBadParams):
		return legBadParams
	case ctx.Err() != nil, errors.As(err, &ne) && ne.Timeout():
		return legTimeout
	}
	return legError
}

// startLeg starts a prefill leg's client span under the call's server
// span; without one it returns ctx and a nil span.
func (c *call) startLeg(ctx context.Context, from int) (context.Context, trace.Span) {
	if c.span == nil {
		return ctx, nil
	}
	u := c.rt.url(from)
	return c.rt.tracer.Start(ctx, "prefill "+c.path, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("http.request.method", http.MethodPost),
		attribute.String("server.address", u.Hostname()),
		attribute.String("url.full", u.JoinPath(c.path).String()),
		attribute.String("kvrouter.replica", c.rt.name(from)),
		attribute.String("kvrouter.leg", legPrefill),
		attribute.Int("kvrouter.leg.attempt", c.pd.legs),
	))
}

// endLeg ends a prefill leg's span with its outcome.
func endLeg(span trace.Span, outcome string, err error) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.String("kvrouter.leg.outcome", outcome))
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// release frees the blocks a prefill leg left held for a decode leg that
// will not be sent (the client went away between the legs). vLLM's
// prefill worker keeps them until a decode worker has read them
// (NixlConnectorScheduler.request_finished delays their free, to at most
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s by default), so the router sends
// the decode leg all the same, detached from the client, to the decided
// decode replica as a one-token, non-streaming request whose answer it
// discards: the decode worker reads the blocks, which frees them. Once a
// decode leg was sent, the router sends no release: a decode worker that
// got the request frees the blocks itself when it aborts it
// (request_finished, with do_remote_prefill still set, asks the prefill
// worker to free them; a request already reading finishes the read), and
// a second reader could read blocks the worker has freed and reused,
// which vLLM would then cache as the prompt's.
func (c *call) release() {
	rt := c.rt
	body, err := oneToken(c.plain, c.pd.params)
	if err != nil {
		rt.xm.releases.WithLabelValues(releaseFailed).Inc()
		return
	}
	to, id := c.replica, c.id
	url := rt.url(to).JoinPath(c.path).String()
	tokens := max(c.freq.Tokens, 0)
	tk, _ := rt.st.fleet.Acquire(rt.name(to), fleet.Claim{Tokens: tokens + 1, PromptTokens: tokens}, rt.now())
	d := rt.cfg.TTFTTimeout
	if d <= 0 {
		d = defaultReleaseTimeout
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), d)
	hdr := http.Header{}
	c.legHeaders(hdr)
	rt.bg.Go(func() {
		defer cancel()
		how := releaseSent
		if err := rt.post(ctx, url, hdr, body); err != nil {
			how = releaseFailed
			rt.log.Warn("kv transfer release failed: the prefill worker's abort timeout frees the blocks", "id", id, "replica", rt.name(to), "err", err)
		}
		tk.Done(rt.now(), fleet.NoUsage, nil)
		rt.xm.releases.WithLabelValues(how).Inc()
	})
}

// post sends body to url with hdr and discards the answer, which must be
// a 200.
func (rt *Router) post(ctx context.Context, url string, hdr http.Header, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header = hdr
	resp, err := rt.upstream.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, maxLegAnswer))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("answered %s", resp.Status)
	}
	return nil
}

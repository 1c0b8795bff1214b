package proxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/kvrouter/kvrouter/view"
)

// Tracing: a routed request is one server span, from its arrival to the
// end of its response, a child of the client's W3C traceparent when it
// sent one; each upstream attempt (the first, every retry before the
// first byte, every continuation of a stream after it) is a client span
// under it, as is each prefill leg of a disaggregated request
// (prefill.go), and the replica receives that client span as its parent in
// traceparent. The server span carries the decision (policy, replica,
// reason, predicted cached tokens, the chosen candidate's cost terms) and
// the outcome; names follow OpenTelemetry's HTTP and GenAI semantic
// conventions where they have one, kvrouter.* otherwise.

// tracerName is the instrumentation scope of the router's spans.
const tracerName = "github.com/kvrouter/kvrouter/proxy"

// newTracer returns the router's tracer (nil when tp is nil or a no-op
// provider: tracing off) and the upstream transport, which with tracing on
// sends each attempt's span context upstream.
func newTracer(tp trace.TracerProvider, upstream http.RoundTripper) (trace.Tracer, http.RoundTripper) {
	if tp == nil {
		return nil, upstream
	}
	if _, ok := tp.(noop.TracerProvider); ok {
		return nil, upstream
	}
	return tp.Tracer(tracerName), traced{upstream}
}

// startSpan starts the server span of a routed request and returns r
// carrying it; without tracing it returns r.
func (c *call) startSpan(r *http.Request) *http.Request {
	tr := c.rt.tracer
	if tr == nil {
		return r
	}
	ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, c.span = tr.Start(ctx, r.Method+" "+r.URL.Path, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String("http.request.method", r.Method),
		attribute.String("http.route", r.URL.Path), // the routed paths are routes
		attribute.String("url.path", r.URL.Path),
		attribute.String("client.address", hostOf(r.RemoteAddr)),
		attribute.String("user_agent.original", r.UserAgent()),
	))
	return r.WithContext(ctx)
}

// endSpan sets the decision and the outcome on the server span and ends
// it.
func (c *call) endSpan() {
	if c.span == nil {
		return
	}
	s := c.span
	attrs := append(make([]attribute.KeyValue, 0, 24),
		attribute.String("kvrouter.request_id", c.id),
		attribute.String("kvrouter.policy", c.rt.policyName),
		attribute.String("kvrouter.outcome", c.outcome),
		attribute.Int("kvrouter.retries", len(c.failed)),
		attribute.Float64("kvrouter.decide_ms", ms(c.decide)),
	)
	if c.status != 0 { // 0: the client left before an answer
		attrs = append(attrs, attribute.Int("http.response.status_code", c.status))
	}
	if c.prompt != nil {
		attrs = append(attrs, c.genAIAttrs()...)
	}
	if c.replica >= 0 {
		attrs = append(attrs, c.decisionAttrs()...)
	}
	if x := c.transfer(); x.Blocks > 0 {
		attrs = append(attrs, attribute.String("kvrouter.transfer.from", c.rt.name(x.From)),
			attribute.Int("kvrouter.transfer.tokens", c.pd.xferTokens))
	}
	if pd := c.legRan(); pd != nil {
		attrs = append(attrs, attribute.Int("kvrouter.prefill.legs", pd.legs), attribute.String("kvrouter.prefill.outcome", pd.leg.outcome))
	}
	if u := c.usage; u.PromptTokens >= 0 {
		attrs = append(attrs, attribute.Int("gen_ai.usage.input_tokens", u.PromptTokens))
	}
	if u := c.usage; u.CachedTokens >= 0 {
		attrs = append(attrs, attribute.Int("kvrouter.cached_tokens", u.CachedTokens),
			attribute.Int("gen_ai.usage.cache_read.input_tokens", u.CachedTokens))
	}
	if u := c.usage; u.CompletionTokens >= 0 {
		attrs = append(attrs, attribute.Int("gen_ai.usage.output_tokens", u.CompletionTokens))
	}
	if c.ttft > 0 {
		attrs = append(attrs, attribute.Float64("kvrouter.ttft_ms", ms(c.ttft)))
	}
	if c.errCode != "" {
		attrs = append(attrs, attribute.String("error.type", c.errCode))
	}
	s.SetAttributes(attrs...)
	if c.status >= 500 || c.outcome == view.OutcomeUpstreamError {
		s.SetStatus(codes.Error, c.outcome)
	}
	s.End(trace.WithTimestamp(c.end))
	c.span = nil
}

// genAIProvider is gen_ai.provider.name: the engines behind the router
// speak vLLM's OpenAI-compatible API (vLLM, SGLang and their emulators);
// the GenAI conventions' list of well-known providers has no entry for
// them, and "openai" would name OpenAI's own service.
const genAIProvider = "vllm"

// genAIAttrs are the request's and response's attributes of
// OpenTelemetry's GenAI semantic conventions (gen-ai-spans, inference):
// the operation (chat or text_completion), the provider, the requested
// model and max_tokens, and the model and id the engine answered with,
// when it reported usage. The usage is set by endSpan.
func (c *call) genAIAttrs() []attribute.KeyValue {
	op := "text_completion"
	if c.prompt.Chat {
		op = "chat"
	}
	attrs := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", op),
		attribute.String("gen_ai.provider.name", genAIProvider),
		attribute.String("gen_ai.request.model", c.prompt.Model),
		attribute.Bool("kvrouter.stream", c.prompt.Stream),
	}
	if c.prompt.MaxTokens > 0 {
		attrs = append(attrs, attribute.Int("gen_ai.request.max_tokens", c.prompt.MaxTokens))
	}
	if c.tapped && c.tap.HasUsage {
		if c.tap.Model != "" {
			attrs = append(attrs, attribute.String("gen_ai.response.model", c.tap.Model))
		}
		if c.tap.ResponseID != "" {
			attrs = append(attrs, attribute.String("gen_ai.response.id", c.tap.ResponseID))
		}
	}
	return attrs
}

// decisionAttrs are the last decision's: the replica, why, the predicted
// cached tokens and the chosen candidate's cost terms (milliseconds of
// predicted time, as in the decision record), or its score.
func (c *call) decisionAttrs() []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		attribute.String("kvrouter.replica", c.rt.name(c.replica)),
		attribute.String("kvrouter.reason", c.dec.Reason),
		attribute.Int("kvrouter.predicted_cached_tokens", c.dec.Matched),
		attribute.String("kvrouter.session_source", c.sessionSrc),
		attribute.String("kvrouter.index", c.index),
		attribute.Int("kvrouter.candidates", len(c.dec.Costs)),
	}
	for _, k := range c.dec.Costs {
		if k.Replica != c.replica {
			continue
		}
		if k.Total == 0 && k.Score != 0 {
			return append(attrs, attribute.Float64("kvrouter.cost.score", k.Score))
		}
		return append(attrs,
			attribute.Float64("kvrouter.cost.wait_ms", ms(k.Wait)),
			attribute.Float64("kvrouter.cost.prefill_ms", ms(k.Prefill)),
			attribute.Float64("kvrouter.cost.decode_ms", ms(k.Decode)),
			attribute.Float64("kvrouter.cost.others_ms", ms(k.Others)),
			attribute.Float64("kvrouter.cost.memory_ms", ms(k.Memory)),
			attribute.Float64("kvrouter.cost.future_ms", ms(k.Future)),
			attribute.Float64("kvrouter.cost.total_ms", ms(k.Total)),
		)
	}
	return attrs
}

// startAttempt starts the client span of an upstream attempt under the
// call's server span and returns the context carrying it; without a
// server span it returns parent and a nil span. An attempt after the
// response's headers went to the client (c.status is set) continues a
// stream.
func (c *call) startAttempt(parent context.Context) (context.Context, trace.Span) {
	if c.span == nil || c.replica < 0 {
		return parent, nil
	}
	u := c.rt.url(c.replica)
	port, _ := strconv.Atoi(u.Port())
	return c.rt.tracer.Start(parent, c.method+" "+c.path, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("http.request.method", c.method),
		attribute.String("server.address", u.Hostname()),
		attribute.Int("server.port", port),
		attribute.String("url.full", u.String()+c.path),
		attribute.String("kvrouter.replica", c.rt.name(c.replica)),
		attribute.Int("kvrouter.attempt", len(c.failed)+1),
		attribute.Bool("kvrouter.continuation", c.status != 0),
	))
}

// endSpan ends the attempt's client span, an error when one of its
// timeouts fired. It runs before the attempt's context is cancelled; a
// second call does nothing.
func (a *attempt) endSpan() {
	if a.span == nil {
		return
	}
	var te *timeoutError
	if errors.As(context.Cause(a.ctx), &te) {
		a.span.SetAttributes(attribute.String("error.type", "timeout_"+te.kind))
		a.span.SetStatus(codes.Error, te.Error())
	}
	a.span.End()
	a.span = nil
}

// traced is the upstream transport with tracing on: a request whose
// context carries a span (an attempt's client span) goes out with that
// span's W3C traceparent (and tracestate) in place of the client's, also
// when the sampler dropped it (its flags say so), and the span notes the
// answer's status. Other requests (probes, scrapes,
// pass-through) pass unchanged.
type traced struct{ next http.RoundTripper }

// RoundTrip implements http.RoundTripper.
func (t traced) RoundTrip(req *http.Request) (*http.Response, error) {
	span := trace.SpanFromContext(req.Context())
	if !span.SpanContext().IsValid() {
		return t.next.RoundTrip(req)
	}
	out := *req // a RoundTripper must not change the request it is given
	out.Header = req.Header.Clone()
	propagation.TraceContext{}.Inject(req.Context(), propagation.HeaderCarrier(out.Header))
	resp, err := t.next.RoundTrip(&out)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		return nil, err
	}
	span.SetAttributes(attribute.Int("http.response.status_code", resp.StatusCode))
	if resp.StatusCode >= 400 {
		span.SetStatus(codes.Error, resp.Status)
	}
	return resp, nil
}

// hostOf is the host of a host:port address, or the address.
func hostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

var _ http.RoundTripper = traced{}

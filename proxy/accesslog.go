package proxy

import (
	"context"
	"log/slog"
	"time"
)

// logAccess writes the access log line of a finished call (a routed
// request or a pass-through), at info level: what was asked (method,
// path, model), what answered (status, outcome, replica, the decision's
// reason and predicted cached tokens) and what came of it (the engine's
// prompt, cached and completion tokens, TTFT and duration in
// milliseconds, retries; the SLO's class, bounds, admission and outcome
// and the mean inter-token latency (slo.go); for a disaggregated request its last prefill
// leg's replica, outcome and duration, its legs and the tokens
// transferred), keyed by the request id the
// X-Kvrouter-Decision header and /debug/decisions show, and by the trace
// id when tracing is on. Token counts the engine did not report, a TTFT
// never reached and an empty model, replica or reason are left out
// rather than logged as zero.
func (rt *Router) logAccess(c *call) {
	ctx := context.Background()
	if !rt.log.Enabled(ctx, slog.LevelInfo) {
		return
	}
	var buf [36]slog.Attr
	a := buf[:0]
	if c.id != "" { // none when the router answered before routing
		a = append(a, slog.String("id", c.id))
	}
	a = append(a, slog.String("method", c.method), slog.String("path", c.path))
	if c.prompt != nil {
		a = append(a, slog.String("model", c.prompt.Model), slog.Bool("stream", c.prompt.Stream))
	}
	a = append(a, slog.Int("status", c.status), slog.String("outcome", c.outcome))
	if c.errCode != "" {
		a = append(a, slog.String("error", c.errCode))
	}
	if c.replica >= 0 {
		a = append(a, slog.String("replica", rt.name(c.replica)))
	}
	if c.routed && c.dec.Reason != "" {
		a = append(a, slog.String("reason", c.dec.Reason), slog.Int("predicted_cached_tokens", c.dec.Matched),
			slog.String("session", c.sessionSrc))
	}
	if pd := c.legRan(); pd != nil {
		a = append(a, slog.String("prefill_replica", rt.name(pd.leg.from)), slog.String("prefill_outcome", pd.leg.outcome),
			slog.Float64("prefill_ms", roundMS(ms(pd.leg.took))), slog.Int("prefill_legs", pd.legs))
	}
	if c.transfer().Blocks > 0 {
		a = append(a, slog.Int("transfer_tokens", c.pd.xferTokens))
	}
	a = appendTokens(a, "prompt_tokens", c.usage.PromptTokens)
	a = appendTokens(a, "cached_tokens", c.usage.CachedTokens)
	a = appendTokens(a, "completion_tokens", c.usage.CompletionTokens)
	if c.ttft > 0 {
		a = append(a, slog.Float64("ttft_ms", roundMS(ms(c.ttft))))
	}
	a = c.appendSLO(a)
	a = append(a, slog.Float64("duration_ms", roundMS(ms(c.end.Sub(c.start)))), slog.Int("retries", len(c.failed)))
	if c.span != nil {
		a = append(a, slog.String("trace_id", c.span.SpanContext().TraceID().String()))
	}
	// A record without a caller's pc: Logger.LogAttrs would walk the
	// stack for one at every request, and no handler shows a source.
	rec := slog.NewRecord(time.Now(), slog.LevelInfo, "request", 0)
	rec.AddAttrs(a...)
	rt.log.Handler().Handle(ctx, rec)
}

// appendTokens appends a token count the engine reported (n >= 0).
func appendTokens(a []slog.Attr, key string, n int) []slog.Attr {
	if n < 0 {
		return a
	}
	return append(a, slog.Int(key, n))
}

// roundMS rounds milliseconds to microseconds.
func roundMS(v float64) float64 { return float64(int64(v*1000+0.5)) / 1000 }

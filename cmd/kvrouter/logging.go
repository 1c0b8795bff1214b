package main

import (
	"context"
	"io"
	"log/slog"
	"time"

	"github.com/kvrouter/kvrouter/proxy"
	"github.com/kvrouter/kvrouter/tracing"
)

// traceFlushTimeout bounds the export of the spans still buffered at
// exit: a collector that is down does not hold the exit up for longer.
const traceFlushTimeout = 5 * time.Second

// newLogger returns the logger of a subcommand: level and format as
// validated by proxy.Config (debug..error; text or json, empty: text).
func newLogger(w io.Writer, level, format string) *slog.Logger {
	l, _ := proxy.ParseLogLevel(level)
	opts := &slog.HandlerOptions{Level: l}
	if format == proxy.LogJSON {
		opts.ReplaceAttr = durationString
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// durationString writes durations as text ("1.5s"), as the text format
// does, not as JSON's integer nanoseconds.
func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

// flushTraces exports the spans still buffered and stops the exporter,
// within traceFlushTimeout, saying so when spans were lost.
func flushTraces(tp *tracing.Provider, log *slog.Logger) {
	if !tp.Enabled() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), traceFlushTimeout)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		log.Warn("traces not all exported at exit", "endpoint", tp.Endpoint(), "err", err)
	}
}

// Package tracing sets up kvrouter's OpenTelemetry tracing: an SDK
// TracerProvider that batches spans and exports them over OTLP/HTTP
// (protobuf) or OTLP/gRPC, on only when a collector endpoint is
// configured, by flag or by the standard OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; otherwise a no-op provider. gRPC is
// chosen by OTEL_EXPORTER_OTLP_PROTOCOL (or ..._TRACES_PROTOCOL) =grpc, or
// by a grpc:// (plaintext) or grpcs:// (TLS) endpoint. The spans
// themselves are made where requests are handled (package proxy).
//
// The exporter reads the other standard variables itself
// (OTEL_EXPORTER_OTLP_HEADERS, ..._TIMEOUT, ..._CERTIFICATE, ...), the
// SDK the sampler (OTEL_TRACES_SAMPLER, default parent-based always-on)
// and the resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES). See
// https://opentelemetry.io/docs/specs/otel/protocol/exporter/.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Standard environment variables (OpenTelemetry SDK configuration).
const (
	EnvEndpoint       = "OTEL_EXPORTER_OTLP_ENDPOINT"        // base URL; /v1/traces is appended
	EnvTracesEndpoint = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" // full URL, used as is
	EnvProtocol       = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvSDKDisabled    = "OTEL_SDK_DISABLED"
	EnvTracesExporter = "OTEL_TRACES_EXPORTER"
	EnvServiceName    = "OTEL_SERVICE_NAME"
)

// TracesPath is the path OTLP/HTTP collectors receive spans on.
const TracesPath = "/v1/traces"

// Protocols, as OTEL_EXPORTER_OTLP_PROTOCOL names them.
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

// Config says where spans go.
type Config struct {
	// Endpoint is the collector's OTLP/HTTP base URL, e.g.
	// http://localhost:4318: spans are posted to Endpoint + TracesPath, as
	// with OTEL_EXPORTER_OTLP_ENDPOINT, over which it takes precedence; or
	// its OTLP/gRPC address, grpc://localhost:4317 (grpcs:// for TLS), or
	// an http(s) URL with OTEL_EXPORTER_OTLP_PROTOCOL=grpc.
	// Empty means the environment decides: tracing is on when
	// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is
	// set, off otherwise.
	Endpoint string
	// ServiceName is the resource's service.name unless OTEL_SERVICE_NAME
	// or OTEL_RESOURCE_ATTRIBUTES sets one; empty means "kvrouter".
	ServiceName string
	// Version is the resource's service.version; empty means none.
	Version string
	// Getenv reads the environment; nil means os.Getenv.
	Getenv func(string) string
	// Logger receives the exporter's errors (a collector that cannot be
	// reached, spans dropped); nil discards them. OpenTelemetry's error
	// handler is process-wide: the last Start sets it.
	Logger *slog.Logger
}

// Provider is the process's tracer provider, an SDK one exporting over
// OTLP/HTTP or OTLP/gRPC, or a no-op one. Shutdown flushes what is
// buffered.
type Provider struct {
	sdk *sdktrace.TracerProvider // nil when off
	to  target                   // where spans go
}

// target is where spans go: the URL they are posted to (OTLP/HTTP), or
// the collector's http:// (plaintext) or https:// URL (OTLP/gRPC).
type target struct {
	url  string
	grpc bool
}

// Start builds the provider cfg asks for. With no endpoint configured it
// returns a no-op provider and no error. Nothing is sent before the first
// span ends: a collector that is down shows as logged export errors, not
// as a failed start.
func Start(ctx context.Context, cfg Config) (*Provider, error) {
	getenv := cfg.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	to, err := targetOf(cfg.Endpoint, getenv)
	if to.url == "" || err != nil {
		return &Provider{}, err
	}
	var exp sdktrace.SpanExporter
	if to.grpc {
		exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(to.url))
	} else {
		exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(to.url))
	}
	if err != nil {
		return nil, fmt.Errorf("otlp exporter: %w", err)
	}
	res, err := newResource(ctx, cfg, getenv)
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("tracing: export failed", "endpoint", to.url, "protocol", to.protocol(), "err", err)
	}))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Provider{sdk: tp, to: to}, nil
}

func (t target) protocol() string {
	if t.grpc {
		return ProtocolGRPC
	}
	return ProtocolHTTP
}

// targetOf returns where spans go (an empty URL when tracing is off), or
// an error for a configuration kvrouter cannot honour. The protocol is
// gRPC for a grpc:// or grpcs:// endpoint or when
// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL (else OTEL_EXPORTER_OTLP_PROTOCOL) is
// grpc, HTTP otherwise. Over HTTP a base URL (the flag's,
// OTEL_EXPORTER_OTLP_ENDPOINT) gets TracesPath appended and
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is used as it is; over gRPC the
// endpoint names the collector, its scheme whether TLS is used
// (grpc and http: plaintext; grpcs and https: TLS).
func targetOf(flag string, getenv func(string) string) (target, error) {
	if strings.EqualFold(getenv(EnvSDKDisabled), "true") || strings.EqualFold(getenv(EnvTracesExporter), "none") {
		return target{}, nil
	}
	endpoint, source := flag, "otlp-endpoint"
	for _, k := range []string{EnvTracesEndpoint, EnvEndpoint} {
		if endpoint == "" {
			endpoint, source = getenv(k), k
		}
	}
	if endpoint == "" {
		return target{}, nil
	}
	k := EnvTracesProtocol
	if getenv(k) == "" {
		k = EnvProtocol
	}
	to := target{url: endpoint}
	switch v := getenv(k); v {
	case "", ProtocolHTTP:
	case ProtocolGRPC:
		to.grpc = true
	default:
		return target{}, fmt.Errorf("%s=%q: kvrouter exports OTLP over http/protobuf or grpc", k, v)
	}
	if scheme, rest, ok := strings.Cut(endpoint, "://"); ok && (scheme == "grpc" || scheme == "grpcs") {
		to.grpc = true
		to.url = map[string]string{"grpc": "http", "grpcs": "https"}[scheme] + "://" + rest
	}
	if err := checkURL(to.url); err != nil {
		return target{}, fmt.Errorf("%s %q: %w", source, endpoint, err)
	}
	if !to.grpc && source != EnvTracesEndpoint {
		to.url, _ = TracesURL(to.url)
	}
	return to, nil
}

// TracesURL is the URL spans are posted to for an OTLP/HTTP base URL:
// its path with TracesPath appended.
func TracesURL(base string) (string, error) {
	if err := checkURL(base); err != nil {
		return "", fmt.Errorf("otlp-endpoint %q: %w", base, err)
	}
	u, _ := url.Parse(base)
	u.Path = strings.TrimRight(u.Path, "/") + TracesPath
	return u.String(), nil
}

// checkURL accepts an http or https URL with a host.
func checkURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return errors.New("want the collector's OTLP/HTTP URL, e.g. http://localhost:4318, or its OTLP/gRPC one, grpc://localhost:4317")
	}
	return nil
}

// newResource describes the process: service.name and service.version,
// then what the environment says (which wins: OTEL_RESOURCE_ATTRIBUTES,
// then OTEL_SERVICE_NAME, read through getenv), and the SDK's own.
func newResource(ctx context.Context, cfg Config, getenv func(string) string) (*resource.Resource, error) {
	name := cfg.ServiceName
	if name == "" {
		name = "kvrouter"
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", name)}
	if cfg.Version != "" {
		attrs = append(attrs, attribute.String("service.version", cfg.Version))
	}
	opts := []resource.Option{resource.WithAttributes(attrs...), resource.WithFromEnv(), resource.WithTelemetrySDK()}
	if v := getenv(EnvServiceName); v != "" {
		opts = append(opts, resource.WithAttributes(attribute.String("service.name", v)))
	}
	res, err := resource.New(ctx, opts...)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing resource: %w", err)
	}
	return res, nil
}

// Enabled reports whether spans are exported.
func (p *Provider) Enabled() bool { return p.sdk != nil }

// Endpoint is the URL spans are posted to (OTLP/HTTP) or the collector's
// (OTLP/gRPC: http:// plaintext, https:// TLS), "" when tracing is off.
func (p *Provider) Endpoint() string { return p.to.url }

// Protocol is http/protobuf or grpc, "" when tracing is off.
func (p *Provider) Protocol() string {
	if p.sdk == nil {
		return ""
	}
	return p.to.protocol()
}

// TracerProvider returns the provider to make tracers from: a no-op one
// when tracing is off.
func (p *Provider) TracerProvider() trace.TracerProvider {
	if p.sdk == nil {
		return noop.NewTracerProvider()
	}
	return p.sdk
}

// Shutdown exports the spans still buffered and stops the exporter,
// within ctx. It does nothing when tracing is off.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p.sdk == nil {
		return nil
	}
	if err := p.sdk.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing shutdown: %w", err)
	}
	return nil
}

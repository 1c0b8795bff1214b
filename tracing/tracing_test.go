package tracing

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace/noop"

	"github.com/kvrouter/kvrouter/internal/otlptest"
)

// TestEndpoint: where spans go for each combination of the flag and the
// standard variables, and the configurations refused.
func TestEndpoint(t *testing.T) {
	for _, tc := range []struct {
		name    string
		flag    string
		env     map[string]string
		want    string
		grpc    bool
		wantErr string
	}{
		{name: "nothing set: off"},
		{name: "flag", flag: "http://c:4318", want: "http://c:4318/v1/traces"},
		{name: "flag with a path", flag: "https://c/otlp/", want: "https://c/otlp/v1/traces"},
		{name: "base variable", env: map[string]string{EnvEndpoint: "http://c:4318"}, want: "http://c:4318/v1/traces"},
		{name: "traces variable as is", env: map[string]string{EnvTracesEndpoint: "http://c:4318/custom", EnvEndpoint: "http://d:4318"}, want: "http://c:4318/custom"},
		{name: "flag over variables", flag: "http://f:1", env: map[string]string{EnvTracesEndpoint: "http://c:4318/x"}, want: "http://f:1/v1/traces"},
		{name: "sdk disabled", flag: "http://f:1", env: map[string]string{EnvSDKDisabled: "true"}},
		{name: "exporter none", env: map[string]string{EnvEndpoint: "http://c:4318", EnvTracesExporter: "none"}},
		{name: "protocol http/protobuf", env: map[string]string{EnvEndpoint: "http://c:4318", EnvProtocol: "http/protobuf"}, want: "http://c:4318/v1/traces"},
		{name: "protocol grpc: the endpoint as is", env: map[string]string{EnvEndpoint: "http://c:4317", EnvProtocol: "grpc"}, want: "http://c:4317", grpc: true},
		{name: "protocol grpc over TLS", env: map[string]string{EnvEndpoint: "https://c:4317", EnvProtocol: "grpc"}, want: "https://c:4317", grpc: true},
		{name: "traces protocol grpc", flag: "http://c:4317", env: map[string]string{EnvTracesProtocol: "grpc", EnvProtocol: "http/protobuf"}, want: "http://c:4317", grpc: true},
		{name: "grpc scheme", flag: "grpc://c:4317", want: "http://c:4317", grpc: true},
		{name: "grpcs scheme", env: map[string]string{EnvTracesEndpoint: "grpcs://c:4317"}, want: "https://c:4317", grpc: true},
		{name: "protocol http/json", env: map[string]string{EnvEndpoint: "http://c:4318", EnvProtocol: "http/json"}, wantErr: "http/protobuf or grpc"},
		{name: "traces protocol decides", env: map[string]string{EnvEndpoint: "http://c:4318", EnvProtocol: "grpc", EnvTracesProtocol: "http/protobuf"}, want: "http://c:4318/v1/traces"},
		{name: "no scheme", flag: "c:4318", wantErr: "otlp-endpoint"},
		{name: "bad variable", env: map[string]string{EnvEndpoint: "ftp://c"}, wantErr: EnvEndpoint},
	} {
		t.Run(tc.name, func(t *testing.T) {
			to, err := targetOf(tc.flag, func(k string) string { return tc.env[k] })
			got := to.url
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %q, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want || to.grpc != tc.grpc {
				t.Fatalf("got %q (grpc %v), %v; want %q (grpc %v)", got, to.grpc, err, tc.want, tc.grpc)
			}
		})
	}
}

// TestStartOff: with no endpoint, Start returns a no-op provider whose
// Shutdown does nothing.
func TestStartOff(t *testing.T) {
	p, err := Start(context.Background(), Config{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	if p.Enabled() || p.Endpoint() != "" {
		t.Errorf("enabled %v endpoint %q, want off", p.Enabled(), p.Endpoint())
	}
	if _, ok := p.TracerProvider().(noop.TracerProvider); !ok {
		t.Errorf("provider %T, want noop.TracerProvider", p.TracerProvider())
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// TestStartExports: a span ended before Shutdown reaches a real
// OTLP/HTTP receiver, with the service name the environment gives.
func TestStartExports(t *testing.T) {
	recv := otlptest.Start(t)
	env := map[string]string{EnvEndpoint: recv.URL, EnvServiceName: "router-a"}
	p, err := Start(context.Background(), Config{Getenv: func(k string) string { return env[k] }, Version: "v9"})
	if err != nil {
		t.Fatal(err)
	}
	_, s := p.TracerProvider().Tracer("test").Start(context.Background(), "op")
	s.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans, services := recv.Spans()
	if len(spans) != 1 || spans[0].GetName() != "op" {
		t.Fatalf("got %d spans (%v), want the one named op", len(spans), spans)
	}
	if services[0] != "router-a" {
		t.Errorf("service.name %q, want router-a (%s)", services[0], EnvServiceName)
	}
}

// TestStartExportsGRPC: the same over OTLP/gRPC to a real gRPC
// TraceService, chosen by OTEL_EXPORTER_OTLP_PROTOCOL=grpc, and by a
// grpc:// endpoint.
func TestStartExportsGRPC(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  func(addr string) map[string]string
	}{
		{"protocol variable", func(addr string) map[string]string {
			return map[string]string{EnvEndpoint: "http://" + addr, EnvProtocol: "grpc"}
		}},
		{"grpc scheme", func(addr string) map[string]string { return map[string]string{EnvTracesEndpoint: "grpc://" + addr} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			recv := otlptest.StartGRPC(t)
			env := tc.env(recv.Addr)
			env[EnvServiceName] = "router-g"
			p, err := Start(context.Background(), Config{Getenv: func(k string) string { return env[k] }})
			if err != nil {
				t.Fatal(err)
			}
			if p.Protocol() != ProtocolGRPC {
				t.Errorf("protocol %q, want grpc", p.Protocol())
			}
			_, s := p.TracerProvider().Tracer("test").Start(context.Background(), "op-grpc")
			s.End()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := p.Shutdown(ctx); err != nil {
				t.Fatal(err)
			}
			spans, services := recv.Spans()
			if len(spans) != 1 || spans[0].GetName() != "op-grpc" || services[0] != "router-g" {
				t.Fatalf("got %d spans (%v, services %v), want op-grpc of router-g", len(spans), spans, services)
			}
		})
	}
}

// TestExportErrorLogged: a collector that refuses the spans (400) is
// reported on the configured logger, not on stderr.
func TestExportErrorLogged(t *testing.T) {
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no", http.StatusBadRequest)
	}))
	defer refuse.Close()
	var buf bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewJSONHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), nil))
	p, err := Start(context.Background(), Config{Endpoint: refuse.URL, Getenv: func(string) string { return "" }, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	_, s := p.TracerProvider().Tracer("test").Start(context.Background(), "op")
	s.End()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p.Shutdown(ctx)
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(buf.String(), `"msg":"tracing: export failed"`) || !strings.Contains(buf.String(), "400") {
		t.Errorf("log %q: want the export failure with its status", buf.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// Package otlptest is a real OTLP trace receiver for tests: an httptest
// server that decodes the protobuf ExportTraceServiceRequest bodies an
// OpenTelemetry exporter posts to /v1/traces (Start), or a gRPC server
// of the TraceService (StartGRPC), keeping their spans. It is what a
// collector does on its OTLP/HTTP (4318) and OTLP/gRPC (4317) ports,
// minus the pipeline.
package otlptest

import (
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// maxBody bounds one export request's body, in bytes.
const maxBody = 16 << 20

// Receiver is the running receiver. Its zero value is not usable: use
// Start.
type Receiver struct {
	// URL is the base URL to give an exporter (spans go to URL/v1/traces).
	URL string

	mu       sync.Mutex // guards spans and services
	spans    []*tracepb.Span
	services []string // each span's resource service.name, index-aligned with spans
}

// Start starts a receiver on loopback, closed when the test ends.
func Start(t testing.TB) *Receiver {
	r := &Receiver{}
	srv := httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

// serve decodes one export request, as OTLP/HTTP specifies: POST
// /v1/traces, Content-Type application/x-protobuf, optionally gzip.
func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.Error(w, "want POST /v1/traces", http.StatusNotFound)
		return
	}
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, "want application/x-protobuf, got "+ct, http.StatusUnsupportedMediaType)
		return
	}
	var body io.Reader = http.MaxBytesReader(w, req.Body, maxBody)
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = io.LimitReader(zr, maxBody)
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var msg coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &msg); err != nil {
		http.Error(w, "decode: "+err.Error(), http.StatusBadRequest)
		return
	}
	r.add(&msg)
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

// add keeps msg's spans.
func (r *Receiver) add(msg *coltracepb.ExportTraceServiceRequest) {
	r.mu.Lock()
	for _, rs := range msg.GetResourceSpans() {
		svc := String(rs.GetResource().GetAttributes(), "service.name")
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, s)
				r.services = append(r.services, svc)
			}
		}
	}
	r.mu.Unlock()
}

// Spans returns the spans received so far, and each one's service.name.
func (r *Receiver) Spans() ([]*tracepb.Span, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*tracepb.Span(nil), r.spans...), append([]string(nil), r.services...)
}

// Attr returns the value of attribute key as a string (ints and floats
// formatted, bools as true/false), and whether it is there.
func Attr(kvs []*commonpb.KeyValue, key string) (string, bool) {
	for _, kv := range kvs {
		if kv.GetKey() != key {
			continue
		}
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			return v.StringValue, true
		case *commonpb.AnyValue_IntValue:
			return fmt.Sprint(v.IntValue), true
		case *commonpb.AnyValue_DoubleValue:
			return fmt.Sprint(v.DoubleValue), true
		case *commonpb.AnyValue_BoolValue:
			return fmt.Sprint(v.BoolValue), true
		}
		return kv.GetValue().String(), true
	}
	return "", false
}

// String returns attribute key as a string, "" when absent.
func String(kvs []*commonpb.KeyValue, key string) string {
	v, _ := Attr(kvs, key)
	return v
}

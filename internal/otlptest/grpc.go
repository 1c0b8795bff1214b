package otlptest

import (
	"context"
	"net"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// GRPCReceiver is a running OTLP/gRPC trace receiver: a gRPC server of
// opentelemetry.proto.collector.trace.v1.TraceService on loopback,
// plaintext. Its zero value is not usable: use StartGRPC.
type GRPCReceiver struct {
	// Addr is the host:port to give an exporter (grpc://Addr).
	Addr string
	// Receiver keeps the spans; its URL is empty.
	*Receiver
}

// traceService answers Export by keeping the request's spans.
type traceService struct {
	coltracepb.UnimplementedTraceServiceServer
	r *Receiver
}

func (s traceService) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	s.r.add(req)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// StartGRPC starts a receiver on loopback, stopped when the test ends.
// Messages are bounded at 16 MiB, as the HTTP receiver's bodies.
func StartGRPC(t testing.TB) *GRPCReceiver {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &GRPCReceiver{Addr: ln.Addr().String(), Receiver: &Receiver{}}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(maxBody))
	coltracepb.RegisterTraceServiceServer(srv, traceService{r: r.Receiver})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return r
}

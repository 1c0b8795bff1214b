// Package epp is kvrouter's endpoint-picker mode: an Envoy external
// processor (ext_proc, gRPC) that speaks the Gateway API Inference
// Extension's endpoint-picker protocol
// (kubernetes-sigs/gateway-api-inference-extension,
// docs/proposals/004-endpoint-picker-protocol). Envoy forwards the
// requests; for each one it streams the request headers and body here,
// the picker routes it with the live router's own code (proxy.Router.Pick:
// the same parsing, fleet.Decide and policy as `kvrouter serve`) and
// answers with the x-gateway-destination-endpoint header and the envoy.lb
// dynamic metadata (the same value: the picked endpoint, then
// Config.Fallbacks others, "ip:port,ip:port", for a data plane that
// tries them in order),
// the body passed through unchanged. The endpoint Envoy reports serving
// the response (x-gateway-destination-endpoint-served) goes into the
// decision record. A request naming an InferenceObjective
// (x-gateway-inference-objective) gets the objective's priority
// (SetObjectives). With Config.Elected only the leader of a leader
// election reports ready (SetLeader), as GIE's replicas do. The response phase
// (headers, body chunks, end) comes back through the same stream: the
// first body bytes end the replica's prefill, the end releases its load,
// so the in-flight accounting the policy reads stays true.
//
// Both request body modes Envoy can route on are served: BUFFERED (the
// headers are answered at once, the routing rides on the body's answer)
// and FULL_DUPLEX_STREAMED (GIE's default: the headers are answered once
// the body is complete, then the body is sent back whole). The mode is
// read from ProcessingRequest.protocol_config when Envoy sends it, else
// Config.BodyMode is assumed.
package epp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/kvrouter/kvrouter/proxy"
)

// BodyMode is the request body mode Envoy's ext_proc filter is configured
// with (processing_mode.request_body_mode).
type BodyMode int

// Body modes the picker serves.
const (
	// FullDuplex is FULL_DUPLEX_STREAMED: body chunks arrive without
	// waiting for answers; the picker answers the headers once the body
	// is complete (GIE's default).
	FullDuplex BodyMode = iota
	// Buffered is BUFFERED: Envoy waits for the headers' answer, then
	// sends the whole body in one message.
	Buffered
)

// Protocol names.
const (
	// DefaultHeader is the request header the picked endpoint is set in.
	DefaultHeader = "x-gateway-destination-endpoint"
	// DefaultNamespace is the dynamic-metadata namespace of the picked
	// endpoint, and of the subset hint's (with ".subset_hint").
	DefaultNamespace = "envoy.lb"
	// SubsetKey is the key, in the envoy.lb.subset_hint filter metadata,
	// of the endpoints (host:port) Envoy allows the picker to choose from.
	SubsetKey = "x-gateway-destination-endpoint-subset"
	// ObjectiveHeader is the request header naming the request's
	// InferenceObjective (its metadata.name), as GIE's clients set it.
	ObjectiveHeader = "x-gateway-inference-objective"
	// ServedKey is the key, in the envoy.lb filter metadata of the
	// response's messages, of the endpoint that served the request.
	ServedKey = "x-gateway-destination-endpoint-served"
)

// Defaults of Config's zero fields.
const (
	DefaultBodyTimeout = 30 * time.Second
	DefaultIdleTimeout = 10 * time.Minute
	// DefaultMaxStreams is the most ext_proc streams (HTTP requests) in
	// flight at once.
	DefaultMaxStreams = 10000
)

// Config is the picker's configuration.
type Config struct {
	// MaxBodyBytes is the largest request body, bytes; a larger one gets
	// an immediate 413 (request_too_large). Zero means
	// proxy.DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// BodyTimeout is the longest from a stream's start to the request
	// body's end; past it the request gets an immediate 408
	// (body_timeout). Zero means DefaultBodyTimeout.
	BodyTimeout time.Duration
	// IdleTimeout is the longest a routed request's stream may go without
	// a message (response headers, body chunks); past it the stream ends
	// and the replica's load is released. Zero means DefaultIdleTimeout.
	IdleTimeout time.Duration
	// BodyMode is the request body mode assumed when Envoy does not send
	// its protocol_config; zero is FullDuplex.
	BodyMode BodyMode
	// Header is the destination header; empty means DefaultHeader.
	Header string
	// Namespace is the destination's dynamic-metadata namespace; empty
	// means DefaultNamespace.
	Namespace string
	// MaxStreams bounds the streams in flight (gRPC's
	// MaxConcurrentStreams, per connection); zero means DefaultMaxStreams.
	MaxStreams uint32
	// Fallbacks is how many endpoints follow the picked one in the
	// destination (GIE's protocol: "ip:port,ip:port,...", the primary
	// first; proxy.Pick.Fallbacks says which); zero means none, the one
	// endpoint an Envoy ORIGINAL_DST cluster reading the header can take
	// (and GIE's reference picker's default).
	Fallbacks int
	// Elected says a leader election decides readiness: the picker reports
	// ready only while SetLeader(true) holds, as GIE's replicas do; false
	// means it leads alone.
	Elected bool
}

// Server is the endpoint picker. Create it with New, serve NewGRPCServer,
// and run Run for its readiness.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	rt      *proxy.Router
	cfg     Config
	log     *slog.Logger
	m       *metrics
	health  *health.Server
	now     func() time.Time
	readers sync.WaitGroup // every stream's reader goroutine
	leader  atomic.Bool    // this replica leads (always, unless Elected)
	// objectives are the pool's InferenceObjectives' priorities by name
	// (SetObjectives); nil: none declared.
	objectives atomic.Pointer[map[string]int]
	healthy    atomic.Bool // a replica was healthy at the last look
}

// New returns a picker routing with rt (whose Run the caller runs), with
// its metrics on reg (nil: not registered) and its log on log (nil:
// discarded).
func New(rt *proxy.Router, cfg Config, reg prometheus.Registerer, log *slog.Logger) (*Server, error) {
	if rt == nil {
		return nil, errors.New("epp: no router")
	}
	if cfg.MaxBodyBytes < 0 || cfg.BodyTimeout < 0 || cfg.IdleTimeout < 0 || cfg.Fallbacks < 0 {
		return nil, fmt.Errorf("epp: negative limit (max body %d, body timeout %s, idle timeout %s)", cfg.MaxBodyBytes, cfg.BodyTimeout, cfg.IdleTimeout)
	}
	if cfg.BodyMode != FullDuplex && cfg.BodyMode != Buffered {
		return nil, fmt.Errorf("epp: unknown body mode %d", cfg.BodyMode)
	}
	cfg.MaxBodyBytes = cmp.Or(cfg.MaxBodyBytes, proxy.DefaultMaxBodyBytes)
	cfg.BodyTimeout = cmp.Or(cfg.BodyTimeout, DefaultBodyTimeout)
	cfg.IdleTimeout = cmp.Or(cfg.IdleTimeout, DefaultIdleTimeout)
	cfg.Header = cmp.Or(cfg.Header, DefaultHeader)
	cfg.Namespace = cmp.Or(cfg.Namespace, DefaultNamespace)
	cfg.MaxStreams = cmp.Or(cfg.MaxStreams, DefaultMaxStreams)
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("epp metrics: %w", err)
	}
	s := &Server{rt: rt, cfg: cfg, log: log, m: m, health: health.NewServer(), now: time.Now}
	s.leader.Store(!cfg.Elected)
	s.setReady(false)
	return s, nil
}

// Health service names, as GIE's picker reports them over the gRPC health
// protocol.
const (
	HealthLiveness  = "liveness"
	HealthReadiness = "readiness"
	// HealthInferenceExtension is readiness under the name GIE's
	// lightweight picker and llm-d's one-replica chart probe.
	HealthInferenceExtension = "inference-extension"
)

// NewGRPCServer returns a gRPC server with the ext_proc service and the
// gRPC health service registered, its message size bounded by
// MaxBodyBytes (plus room for headers), its streams per connection by
// MaxStreams, and keepalives on. opts come after these and may override
// them (TLS credentials, say).
func (s *Server) NewGRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	base := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(int(s.cfg.MaxBodyBytes) + 1<<20),
		grpc.MaxConcurrentStreams(s.cfg.MaxStreams),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: time.Minute, Timeout: 20 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
	g := grpc.NewServer(append(base, opts...)...)
	extprocv3.RegisterExternalProcessorServer(g, s)
	healthpb.RegisterHealthServer(g, s.health)
	return g
}

// SetLeader says whether this replica leads (Config.Elected): readiness
// follows at once. A follower keeps routing what reaches it, its state
// warm (scrapes, health, KV events), and reports not ready.
func (s *Server) SetLeader(leader bool) {
	s.leader.Store(leader)
	s.setReady(s.healthy.Load())
}

// SetObjectives replaces the priorities of the pool's
// InferenceObjectives, by objective name: a request naming one in
// ObjectiveHeader gets its priority (proxy.HeaderPriority, clamped to
// ±1000; negative is sheddable) in place of any the client sent.
func (s *Server) SetObjectives(prio map[string]int) { s.objectives.Store(&prio) }

// Leader reports whether this replica leads.
func (s *Server) Leader() bool { return s.leader.Load() }

// Run keeps the readiness the health service reports current (serving
// while this replica leads and at least one replica is healthy) until
// ctx is done, then reports not serving, waits for the streams' readers
// to end (stop the gRPC server first) and returns nil.
func (s *Server) Run(ctx context.Context) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		s.healthy.Store(s.anyHealthy())
		s.setReady(s.healthy.Load())
		select {
		case <-ctx.Done():
			s.healthy.Store(false)
			s.setReady(false)
			s.health.Shutdown()
			s.readers.Wait()
			return nil
		case <-tick.C:
		}
	}
}

func (s *Server) anyHealthy() bool {
	for _, r := range s.rt.View(s.now()).Replicas {
		if r.Healthy {
			return true
		}
	}
	return false
}

// setReady sets the health service's statuses: liveness always serving;
// readiness, the ext_proc service and the server as a whole ("", what a
// load balancer asks) serving when a replica is healthy and this one
// leads, as GIE's picker reports them.
func (s *Server) setReady(healthy bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if healthy && s.leader.Load() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(HealthLiveness, healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(HealthReadiness, st)
	s.health.SetServingStatus(HealthInferenceExtension, st)
	s.health.SetServingStatus(extprocv3.ExternalProcessor_ServiceDesc.ServiceName, st)
}

// Process serves one ext_proc stream: one HTTP request through Envoy.
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	st := newStream(s, srv)
	return st.run()
}

var _ extprocv3.ExternalProcessorServer = (*Server)(nil)

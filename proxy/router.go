// Package proxy is kvrouter's data plane: an OpenAI-compatible streaming
// reverse proxy (httputil.ReverseProxy) that routes every request with a
// route.Policy over a fleet snapshot, forwards the body unchanged (but for
// stream_options.include_usage and, for a KV transfer, kv_transfer_params:
// prefill/decode disaggregation runs as vLLM's two legs), streams
// SSE byte for byte, retries on another replica only before the first byte
// reaches the client, and records each decision with what came of it.
package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvrouter/kvrouter/dashboard"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/peers"
	"github.com/kvrouter/kvrouter/route"
)

// Deps are what New takes besides the Config. Every field may be left zero.
type Deps struct {
	// Registry receives the router's metrics; nil means a private registry.
	Registry prometheus.Registerer
	// Gatherer serves /metrics; nil means Registry when it is also a
	// Gatherer (a *prometheus.Registry), else no /metrics route.
	Gatherer prometheus.Gatherer
	// Logger receives the access log, one line per request at info level
	// (accesslog.go), and operational messages; nil means discard.
	Logger *slog.Logger
	// TracerProvider makes the spans of routed requests: a server span
	// per request, a client span per upstream attempt, W3C trace context
	// sent upstream (spans.go). Nil (or a no-op provider) means no spans,
	// and a client's traceparent passes through unchanged.
	TracerProvider trace.TracerProvider
	// Transport carries upstream requests; nil means a pooled
	// http.Transport tuned for many concurrent streams to few hosts.
	Transport http.RoundTripper
	// Policy overrides Config.Policy (tests, experiments); nil means the
	// policy Config.Policy names.
	Policy route.Policy
	// Now is the router's clock; nil means time.Now. Tests drive the
	// router's decisions on a clock of their own with it.
	Now func() time.Time
	// Calibration is the template of each replica's calibrators
	// (fleet.Config.Calibration); the zero value uses the defaults. The
	// demo pins it (Min = Max = 1): its emulated replicas run at the
	// preset's rates by construction, and the wall-clock TTFTs a busy
	// host stretches would teach the router otherwise.
	Calibration fleet.Calibrator
}

// Router is the live router. Create it with New, serve Handler, and run Run
// for the background loops (metrics scrapes and health probes).
type Router struct {
	// requests and requestsFailed count finished completion requests as
	// their clients saw them (view.Fleet.Requests); observe adds.
	requests, requestsFailed atomic.Int64
	cfg                      Config
	log                      *slog.Logger
	mm                       *memberMetrics
	policy                   route.Policy
	policyName               string
	m                        *metrics
	gatherer                 prometheus.Gatherer
	decisions                *ring
	seq                      atomic.Uint64
	xm                       *transferMetrics
	idPrefix                 string            // "kvr-<epoch>-", request ids append a sequence number
	upstream                 http.RoundTripper // the plain transport
	rp                       *httputil.ReverseProxy
	models                   modelsCache
	st                       *state
	adm                      *admission // nil: admission control off
	sm                       *sloMetrics
	pool                     sync.Pool   // *call, with its buffers
	scratches                scratchList // the calls' decision scratches (call.sc)
	readBufs                 readBufs    // stream read buffers
	now                      func() time.Time
	start                    time.Time     // the router's start: time zero of the residency index
	sf                       surface       // keys, pass-through list, id hashing
	live                     liveSet       // API requests in flight, for the drain
	shared                   *peers.Syncer // nil without Config.Peers.URL (peers.go)
	// bg joins the requests the router sends detached from a client
	// (release, prefill.go); Run waits for them.
	bg sync.WaitGroup

	tracer trace.Tracer // nil: tracing off (Deps.TracerProvider)

	rec recording // --record (recording.go)

	// dash is the dashboard, its history sampled while Run runs.
	dash *dashboard.Handler

	// budget bounds the request bodies held together (budget.go).
	budget *BodyBudget

	threads threads // the Responses API's responses routed (responses.go)
}

// New validates cfg and builds a Router. Nothing runs until Run, except in
// precise mode (KV events configured), where New already starts the KV-event
// Subscriber (binding Config.KVEventsBind, so that a taken address fails
// here); Run closes it when its context ends, so call Run.
func New(cfg Config, deps Deps) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("proxy config: %w", err)
	}
	rt := &Router{cfg: cfg, log: deps.Logger, upstream: deps.Transport, policy: deps.Policy, policyName: cfg.Policy, now: deps.Now}
	if rt.now == nil {
		rt.now = time.Now
	}
	rt.start = rt.now()
	if rt.log == nil {
		rt.log = slog.New(slog.DiscardHandler)
	}
	if rt.policy == nil {
		p, err := route.New(cfg.policyName())
		if err != nil {
			return nil, err
		}
		rt.policy, rt.policyName = p, cfg.policyName()
	} else if rt.policyName == "" {
		rt.policyName = fmt.Sprintf("%T", rt.policy)
	}
	sf, err := newSurface(&rt.cfg)
	if err != nil {
		return nil, err
	}
	rt.sf = sf
	if rt.upstream == nil {
		t := newTransport(&cfg)
		if err := trustBackendCA(t, cfg.BackendCA); err != nil {
			return nil, err
		}
		rt.upstream = t
	}
	rt.tracer, rt.upstream = newTracer(deps.TracerProvider, rt.upstream)
	reg := deps.Registry
	if reg == nil {
		r := prometheus.NewRegistry()
		reg, deps.Gatherer = r, r
	}
	rt.gatherer = deps.Gatherer
	if g, ok := reg.(prometheus.Gatherer); ok && rt.gatherer == nil {
		rt.gatherer = g
	}
	rt.budget = newBudget(&cfg)
	m, err := newMetrics(reg, rt.budget)
	if err != nil {
		return nil, fmt.Errorf("proxy metrics: %w", err)
	}
	rt.m = m
	if rt.xm, err = newTransferMetrics(reg, cfg.Preset); err != nil {
		return nil, fmt.Errorf("proxy metrics: %w", err)
	}
	rt.decisions = newRing(cfg.Decisions)
	if rt.mm, err = newMemberMetrics(reg); err != nil {
		return nil, fmt.Errorf("proxy metrics: %w", err)
	}
	if rt.adm, err = newAdmission(cfg.Admission, reg); err != nil {
		return nil, fmt.Errorf("proxy metrics: %w", err)
	}
	if rt.sm, err = newSLOMetrics(reg); err != nil {
		return nil, fmt.Errorf("proxy metrics: %w", err)
	}
	var onRelease func()
	if rt.adm != nil {
		onRelease = rt.adm.wake
	}
	rt.decisions.idKey = rt.sf.idKey
	st, err := newState(&rt.cfg, rt.policy, rt.upstream, rt.log, rt.now, rt.start, onRelease, deps.Calibration)
	if err != nil {
		return nil, err
	}
	rt.st = st
	rt.decisions.bes = &st.bes
	rt.decisions.weight = route.TTFTWeight(rt.policy)
	rt.dash = dashboard.NewHandler(dashSource{rt})
	st.m = m
	st.logIndexMode(&rt.cfg, rt.policyName)
	rt.idPrefix = "kvr-" + strconv.FormatUint(st.epoch, 36) + "-"
	if err := reg.Register(newTokenizeCollector(st.hasher)); err != nil {
		return nil, fmt.Errorf("proxy metrics: %w", err)
	}
	if err := reg.Register(newFleetCollector(st.fleet, rt.now)); err != nil {
		return nil, fmt.Errorf("proxy metrics: %w", err)
	}
	if p := st.feed; p != nil {
		if _, err := kvevents.NewMetrics(reg, p.sub, p.label); err != nil {
			p.sub.Close()
			return nil, fmt.Errorf("proxy metrics: %w", err)
		}
		if err := reg.Register(newModeCollector(p)); err != nil {
			p.sub.Close()
			return nil, fmt.Errorf("proxy metrics: %w", err)
		}
	}
	rt.rp = &httputil.ReverseProxy{
		Rewrite:        rt.rewrite,
		Transport:      retrier{rt},
		ModifyResponse: rt.modifyResponse,
		ErrorHandler:   rt.errorHandler,
		BufferPool:     &bufferPool{},
		ErrorLog:       slog.NewLogLogger(rt.log.Handler(), slog.LevelDebug),
	}
	rt.pool.New = func() any { return &call{bufs: newBufs()} }
	if rt.shared, err = rt.newShared(reg); err != nil {
		return nil, err
	}
	if err := rt.startRecording(reg); err != nil {
		return nil, err
	}
	return rt, nil
}

// newTransport returns the upstream transport: keep-alive pools sized for
// many concurrent streams to a few replicas, no response compression (the
// bytes pass through as the replica sent them), connections bounded by
// cfg.ConnectTimeout. It sets no response-header timeout: a non-streaming
// answer's headers come with its last token; the retrier's attempts bound
// a stream's first token and silences (cfg.TTFTTimeout,
// cfg.StreamIdleTimeout) and every request (cfg.RequestTimeout), also over
// a transport given in Deps.
func newTransport(cfg *Config) *http.Transport {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: cfg.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		TLSHandshakeTimeout: cfg.ConnectTimeout,
	}
}

// Replicas returns the base URLs of the replicas serving or draining, in
// replica-index order.
func (rt *Router) Replicas() []string {
	var out []string
	for _, m := range rt.st.fleet.Members() {
		if m.State != fleet.StateRemoved {
			out = append(out, m.ID)
		}
	}
	return out
}

// name is replica i's base URL.
func (rt *Router) name(i int) string { return rt.st.bes.at(i).cfg.URL }

// url is replica i's parsed base URL.
func (rt *Router) url(i int) *url.URL { return rt.st.bes.at(i).url }

// Policy returns the name of the routing policy.
func (rt *Router) Policy() string { return rt.policyName }

// Handler returns the API surface: the OpenAI routes, /v1/models and
// /v1/models/{id}, the probes /health, /livez and /readyz, and a
// pass-through to a replica for the paths Config.PassThrough allows; any
// other path is a JSON 404, a wrong method a JSON 405. With Config.APIKeys
// every path but the probes asks for a key. The dashboard, /debug and
// /metrics are on AdminHandler.
func (rt *Router) Handler() http.Handler {
	mux := http.NewServeMux()
	count := rt.countAPI
	handle(mux, http.MethodPost, "/v1/chat/completions", rt.serveCompletion, count)
	handle(mux, http.MethodPost, "/v1/completions", rt.serveCompletion, count)
	handle(mux, http.MethodPost, "/v1/responses", rt.serveResponses, count)
	handle(mux, http.MethodGet, "/v1/models", rt.serveModels, count)
	handle(mux, http.MethodGet, "/v1/models/{id...}", rt.serveModel, count)
	handle(mux, http.MethodGet, "/health", rt.serveHealth, count)
	handle(mux, http.MethodGet, "/livez", rt.serveLive, count)
	handle(mux, http.MethodGet, "/readyz", rt.serveReady, count)
	mux.HandleFunc("/", rt.servePassThrough)
	return rt.live.track(&gate{keys: rt.sf.apiKeys, strip: true, count: count, next: canonical(count, mux)})
}

// Run runs the background loops (metrics scrapes, health probes, and in
// precise mode the KV-event health watch) until ctx is done, then waits for
// them and for the releases of KV transfers in flight (each bounded by
// its timeout), closes the KV-event Subscriber and returns nil.
func (rt *Router) Run(ctx context.Context) error {
	rt.bg.Go(func() { rt.dash.Run(ctx) })
	err := rt.runShared(ctx, rt.st.run)
	rt.bg.Wait()
	rt.StopRecording()
	return err
}

// serveHealth answers 200 when at least one replica is healthy, else 503.
func (rt *Router) serveHealth(w http.ResponseWriter, r *http.Request) {
	for i := range rt.st.bes.list() {
		if rt.st.healthy(i) {
			w.WriteHeader(http.StatusOK)
			return
		}
	}
	rt.writeNoReplica(w)
}

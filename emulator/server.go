// Package emulator runs the engine model on a wall clock behind vLLM's
// protocols: the OpenAI-compatible HTTP API (chat and text completions,
// streaming or not, /v1/models, /health, /tokenize), Prometheus /metrics
// with vLLM's or SGLang's names, and KV-cache events over ZMQ in vLLM's
// format. Like vLLM it can serve one model under several names and LoRA
// adapters on top of it, all on one KV cache. It stands in for a GPU
// replica in tests, benchmarks and the demo.
//
// One goroutine owns the engine (docs/architecture.md, "Time is an argument"): HTTP handlers submit requests
// and cancellations over channels and follow their requests through
// per-request state; the loop calls engine.Step, delivers its events and
// publishes a Stats snapshot for /metrics through an atomic.Pointer.
package emulator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/route"
)

// Metrics flavors (MetricsFlavor).
const (
	// FlavorVLLM exposes vLLM's metric names (vllm:...).
	FlavorVLLM = "vllm"
	// FlavorSGLang exposes SGLang's metric names (sglang:...).
	FlavorSGLang = "sglang"
	// FlavorLlamaCpp is llama-server's names (llamacpp:...): the flavor
	// of an engine of a llama.cpp preset, whatever was asked (llamacpp.go).
	FlavorLlamaCpp = "llamacpp"
)

// DefaultMaxTokens is the output length of a request that gives neither
// max_tokens nor max_completion_tokens (capped by the model length); such
// a request finishes with finish_reason "stop", as if the model emitted
// its end-of-sequence token.
const DefaultMaxTokens = 64

// Config configures one emulated replica.
type Config struct {
	// Model is the served model name, the first of vLLM's
	// --served-model-name list: the name responses carry, the metrics'
	// model_name label, the model in the KV-event topic and the parent of
	// the LoRA adapters. Requests naming a model that is neither Model, an
	// alias nor an adapter get a 404. Empty means "emulated".
	Model string
	// Aliases are further names of the same model on the same engine
	// (vLLM's further --served-model-name values). A request may name any
	// of them; they share one KV cache with Model, since block hashes do
	// not depend on the served name.
	Aliases []string
	// LoRAs are the LoRA adapters loaded on the engine (vLLM's
	// --lora-modules), by name. A request naming one is served with that
	// adapter, whose name is an extra key of every block hash: its blocks
	// never match the base model's, and its KV events carry its name and
	// id (1, 2, ... in this order, as vLLM numbers statically loaded
	// adapters).
	LoRAs []string
	// KVFullStatus, if not zero, is the HTTP status (400..599) answered
	// with an OpenAI error, before anything is streamed, to a request the
	// KV cache has no room for on arrival, as llm-d-inference-sim answers
	// 500: one whose prompt blocks not in the prefix cache outnumber the
	// blocks no running request holds (free or evictable). Zero means
	// vLLM's behaviour: the request waits in the queue until blocks free
	// up.
	KVFullStatus int
	// Preset names an engine preset (engine.Presets()); empty means Engine
	// is used as given.
	Preset string
	// Engine is the engine configuration when Preset is empty.
	Engine engine.Config
	// MaxNumSeqs and KVBlocks override the preset's or Engine's
	// MaxNumSeqs and NumBlocks; zero keeps them.
	MaxNumSeqs, KVBlocks int
	// BlockSize overrides the tokens per KV block (vLLM's --block-size);
	// zero keeps the preset's (16). Without KVBlocks the capacity in tokens
	// stays the preset's.
	BlockSize int
	// CPUKVBlocks gives the engine a CPU offload tier of that many blocks
	// (engine.Config.CPUBlocks), loaded back at PCIeGBps (GB/s; zero: the
	// engine's default); zero keeps the preset's (none).
	CPUKVBlocks int
	PCIeGBps    float64
	// InterconnectGBps overrides the bandwidth, in GB/s each way, of the
	// links KV transfers between replicas take (engine.Config
	// InterconnectGBps; kv_transfer_params); zero keeps the preset's.
	InterconnectGBps float64
	// KVRole is the engine's part in prefill/decode disaggregation, as
	// vLLM's kv_role (transfer.go): route.RolePrefill (kv_producer) holds
	// a prefill leg's blocks for a decode worker and computes a decode
	// leg's prompt itself; route.RoleDecode (kv_consumer) reads a decode
	// leg's blocks from its prefill worker and serves a prefill leg as a
	// plain request; the zero value, route.RoleBoth (kv_both), does both.
	KVRole route.Role
	// KVHoldTimeout is how long, in engine time, a prefill leg's blocks
	// are held for a decode worker that does not read them (vLLM's
	// VLLM_NIXL_ABORT_REQUEST_TIMEOUT); zero means DefaultKVHoldTimeout.
	KVHoldTimeout time.Duration
	// EngineID names the engine in the kv_transfer_params of its prefill
	// legs (remote_engine_id, vLLM's kv_transfer_config.engine_id); empty
	// means a random id.
	EngineID string
	// SideChannelHost is the host a prefill leg's kv_transfer_params name
	// for its side channel (remote_host, vLLM's
	// VLLM_NIXL_SIDE_CHANNEL_HOST); empty means the local address the
	// leg's connection came in on. The port is always that connection's:
	// the side channel is served on the HTTP API (TransferPath).
	SideChannelHost string
	// TimeScale is wall seconds per engine second: 0.05 runs the model 20×
	// faster than real time. Zero means 1.
	TimeScale float64
	// KVEventsEndpoint is the ZMQ endpoint of the KV-event PUB socket, e.g.
	// "tcp://*:5557"; empty disables events. It binds when it has a "*",
	// "::", port 0, or is ipc:// or inproc://, and connects otherwise
	// (vLLM's rule). "tcp://127.0.0.1:*" binds a random loopback port.
	KVEventsEndpoint string
	// ReplayEndpoint is the ZMQ ROUTER endpoint answering replay requests;
	// empty disables replay. It always binds.
	ReplayEndpoint string
	// KVEventsFormat is FormatMap or FormatArray; empty means FormatMap.
	KVEventsFormat string
	// Topic is the first frame of every KV-event message; empty means ""
	// (vLLM's default), except that Start sets "kv@<host>:<port>@<model>".
	Topic string
	// MetricsFlavor is FlavorVLLM or FlavorSGLang; empty means FlavorVLLM.
	MetricsFlavor string
	// MaxBodyBytes caps request bodies; larger ones get a 413. Zero means
	// 16 MiB.
	MaxBodyBytes int64
	// Logger receives the few warnings of the ZMQ side; nil means
	// slog.Default().
	Logger *slog.Logger
	// OnDone, if not nil, is called with the HTTP request and the final
	// engine event of every request that completes (usage, and its timing
	// on the engine clock: Arrived, First, At), on the request's handler
	// goroutine before its last bytes are written. The demo reads its
	// latencies from it: engine time does not stretch when the host is
	// busy, as wall time does.
	OnDone func(r *http.Request, final engine.Event)
}

// DefaultKVHoldTimeout is how long a prefill leg's blocks are held for a
// decode worker when Config.KVHoldTimeout is zero: vLLM's
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT default (vllm/envs.py).
const DefaultKVHoldTimeout = 480 * time.Second

// Server is one emulated replica. Its engine runs only while Run runs (or
// between Start and Close): requests made before Run wait for it, requests
// made after it returned get a 503, and /health answers 503 once it has
// returned.
type Server struct {
	cfg   Config
	ecfg  engine.Config
	scale float64
	log   *slog.Logger
	eng   *engine.Engine // owned by the Run goroutine
	pub   *publisher     // nil without KV events
	enc   *batchEncoder
	reg   *prometheus.Registry
	m     *metrics
	stats atomic.Pointer[engine.Stats]

	submit  chan *flight
	cancels chan string
	resets  chan chan struct{}
	running atomic.Bool
	stopped chan struct{} // closed when Run returns
	ids     atomic.Uint64
	created int64 // unix seconds, for /v1/models

	served   map[string]servedModel // request model name → how to serve it
	cards    []modelCard            // the /v1/models list, immutable
	rejected atomic.Int64           // requests answered KVFullStatus

	responses responseStore // for previous_response_id (responses.go)

	reads chan *readOrder // side-channel reads of held blocks, to the engine loop
	peers *http.Client    // for the sources of KV imports
	tm    *transferMetrics

	closeOnce sync.Once
	http      *http.Server // Start only
	stop      context.CancelFunc
	wg        sync.WaitGroup
	url       string
}

// New validates cfg, builds the engine and opens the ZMQ sockets (binding
// now, so their addresses are known). Call Run, or use Start instead.
func New(cfg Config) (*Server, error) {
	if cfg.Model == "" {
		cfg.Model = "emulated"
	}
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 1
	}
	if cfg.TimeScale < 0 {
		return nil, fmt.Errorf("emulator: negative time scale %g", cfg.TimeScale)
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = 16 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.KVFullStatus != 0 && (cfg.KVFullStatus < 400 || cfg.KVFullStatus > 599) {
		return nil, fmt.Errorf("emulator: kv full status %d: want 400..599, or 0 to queue", cfg.KVFullStatus)
	}
	if err := kvTransferConfig(&cfg); err != nil {
		return nil, err
	}
	served, err := servedModels(cfg)
	if err != nil {
		return nil, err
	}
	switch cfg.KVEventsFormat {
	case "":
		cfg.KVEventsFormat = FormatMap
	case FormatMap, FormatArray:
	default:
		return nil, fmt.Errorf("emulator: kv events format %q: want %q or %q", cfg.KVEventsFormat, FormatMap, FormatArray)
	}
	switch cfg.MetricsFlavor {
	case "":
		cfg.MetricsFlavor = FlavorVLLM
	case FlavorVLLM, FlavorSGLang:
	default:
		return nil, fmt.Errorf("emulator: metrics flavor %q: want %q or %q", cfg.MetricsFlavor, FlavorVLLM, FlavorSGLang)
	}
	ecfg, err := engineConfig(cfg)
	if err != nil {
		return nil, err
	}
	eng, err := engine.New(ecfg)
	if err != nil {
		return nil, fmt.Errorf("emulator: %w", err)
	}
	if eng.Config().Kind == engine.KindLlamaCpp {
		cfg.MetricsFlavor = FlavorLlamaCpp
	}
	s := &Server{
		cfg:     cfg,
		ecfg:    eng.Config(),
		scale:   cfg.TimeScale,
		log:     cfg.Logger,
		eng:     eng,
		enc:     newBatchEncoder(cfg.KVEventsFormat, cfg.LoRAs),
		reg:     prometheus.NewRegistry(),
		submit:  make(chan *flight),
		cancels: make(chan string, 64),
		resets:  make(chan chan struct{}),
		reads:   make(chan *readOrder),
		peers:   peerClient(),
		stopped: make(chan struct{}),
		created: time.Now().Unix(),
		served:  served,
	}
	s.cards = s.modelCards()
	st := eng.Stats()
	s.stats.Store(&st)
	if cfg.MetricsFlavor == FlavorLlamaCpp {
		s.m = llamaCppMetrics(s.reg, s.stats.Load)
	} else {
		s.m = newMetrics(s.reg, cfg.MetricsFlavor, cfg.Model, s.ecfg, s.stats.Load)
	}
	s.tm = newTransferMetrics(s.reg, cfg, s.stats.Load)
	if cfg.KVEventsEndpoint != "" {
		s.pub, err = newPublisher(cfg.KVEventsEndpoint, cfg.ReplayEndpoint, cfg.Topic, cfg.Logger)
		if err != nil {
			return nil, fmt.Errorf("emulator: %w", err)
		}
	}
	return s, nil
}

// engineConfig resolves the preset and the overrides.
func engineConfig(cfg Config) (engine.Config, error) {
	ec := cfg.Engine
	if cfg.Preset != "" {
		p, err := engine.Preset(cfg.Preset)
		if err != nil {
			return ec, fmt.Errorf("emulator: %w", err)
		}
		ec = p
	}
	if cfg.MaxNumSeqs < 0 || cfg.KVBlocks < 0 || cfg.BlockSize < 0 || cfg.CPUKVBlocks < 0 || cfg.PCIeGBps < 0 || cfg.InterconnectGBps < 0 {
		return ec, errors.New("emulator: negative max num seqs, kv blocks, block size, CPU blocks, PCIe or interconnect bandwidth")
	}
	if cfg.InterconnectGBps > 0 {
		ec.InterconnectGBps = cfg.InterconnectGBps
	}
	if cfg.CPUKVBlocks > 0 {
		ec.CPUBlocks = cfg.CPUKVBlocks
	}
	if cfg.PCIeGBps > 0 {
		ec.PCIeGBps = cfg.PCIeGBps
	}
	if bs := cfg.BlockSize; bs > 0 && bs != ec.BlockSize {
		old := max(ec.BlockSize, 16)
		ec.NumBlocks = ec.NumBlocks * old / bs
		ec.BlockSize = bs
	}
	if cfg.MaxNumSeqs > 0 {
		ec.MaxNumSeqs = cfg.MaxNumSeqs
	}
	if cfg.KVBlocks > 0 {
		ec.NumBlocks = cfg.KVBlocks
	}
	ec.NoTokenEvents = false
	if ec.Root == 0 {
		ec.Root = prefix.Root(cfg.Model, "")
	}
	return ec, nil
}

// EngineConfig is the engine's configuration after defaults, presets and
// overrides.
func (s *Server) EngineConfig() engine.Config { return s.ecfg }

// Models are the served model names: Model, then the aliases.
func (s *Server) Models() []string { return append([]string{s.cfg.Model}, s.cfg.Aliases...) }

// LoRAs are the names of the loaded LoRA adapters.
func (s *Server) LoRAs() []string { return slices.Clone(s.cfg.LoRAs) }

// Rejected counts the requests answered Config.KVFullStatus because the
// KV cache had no room for them.
func (s *Server) Rejected() int64 { return s.rejected.Load() }

// KVEventsEndpoint is an endpoint a local SUB socket can dial for the
// KV events ("tcp://127.0.0.1:PORT" for a bound tcp endpoint), or "" when
// events are off or the publisher connects out.
func (s *Server) KVEventsEndpoint() string {
	if s.pub == nil {
		return ""
	}
	return s.pub.pubAddr
}

// ReplayEndpoint is an endpoint a local DEALER socket can dial for
// replay, or "" when replay is off.
func (s *Server) ReplayEndpoint() string {
	if s.pub == nil {
		return ""
	}
	return s.pub.replayAddr
}

// Topic is the first frame of every KV-event message.
func (s *Server) Topic() string { return s.cfg.Topic }

// Stats is the engine's state as of its last step.
func (s *Server) Stats() engine.Stats { return *s.stats.Load() }

// Registry is the server's own Prometheus registry (served on /metrics).
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Start builds a server, listens on addr ("127.0.0.1:0" picks a free
// port), and runs the engine loop and the HTTP server until Close. If
// cfg.Topic is empty it becomes "kv@<host>:<port>@<model>".
func Start(cfg Config, addr string) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("emulator: listen %s: %w", addr, err)
	}
	if cfg.Topic == "" {
		m := cfg.Model
		if m == "" {
			m = "emulated"
		}
		cfg.Topic = "kv@" + ln.Addr().String() + "@" + m
	}
	s, err := New(cfg)
	if err != nil {
		ln.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	s.url = "http://" + ln.Addr().String()
	s.http = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	s.wg.Go(func() { s.Run(ctx) })
	s.wg.Go(func() { s.http.Serve(ln) })
	return s, nil
}

// URL is the base URL of a server made by Start, e.g.
// "http://127.0.0.1:41234"; "" otherwise.
func (s *Server) URL() string { return s.url }

// Close stops a server made by Start (HTTP server, engine loop, ZMQ
// sockets) and waits for its goroutines; on a server run with Run it only
// closes the ZMQ sockets (cancel Run's context first). Close is idempotent.
func (s *Server) Close() error {
	if s.http != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		s.stop() // ends the engine loop: in-flight requests fail fast
		if err := s.http.Shutdown(ctx); err != nil {
			s.http.Close()
		}
		cancel()
		s.wg.Wait()
	}
	s.closePublisher()
	return nil
}

func (s *Server) closePublisher() {
	s.closeOnce.Do(func() {
		if s.pub != nil {
			s.pub.close()
		}
	})
}

// Reset drops every cached block, as a restarted engine would: requests in
// flight fail, and subscribers get an AllBlocksCleared event. It returns
// once done, or at once if the engine loop is not running.
func (s *Server) Reset() {
	if !s.running.Load() {
		return
	}
	ack := make(chan struct{})
	select {
	case s.resets <- ack:
		<-ack
	case <-s.stopped:
	}
}

// newID returns a unique request id with the given prefix.
func (s *Server) newID(prefix string) string {
	return fmt.Sprintf("%s%016x", prefix, s.ids.Add(1))
}

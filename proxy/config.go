package proxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/hashing"
	"github.com/kvrouter/kvrouter/health"
	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/peers"
	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/record"
	"github.com/kvrouter/kvrouter/route"
)

// Config is everything the router needs to start. The zero value is not
// usable: start from DefaultConfig, then overlay a file (ReadConfigFile),
// environment variables and flags (cmd/kvrouter does that), and let New
// validate it once.
type Config struct {
	// Listen is the address the router serves on, host:port.
	Listen string `yaml:"listen"`
	// Backends are the replicas, in order; their index is the replica index
	// in route.Snapshot.
	Backends []Backend `yaml:"backend"`
	// MaxBackends bounds the backends at once, those added while the
	// router runs (admin API, config reload, discovery) included; zero
	// means max(len(Backends), DefaultMaxBackends).
	MaxBackends int `yaml:"max-backends"`
	// Discover is where the backends are found (package discover): a DNS
	// name whose records they are (dns://name:port,
	// dns+srv://_service._proto.name), or pods watched in the Kubernetes
	// API (k8s://namespace/selector?port=N, inferencepool://namespace/name);
	// empty means none. With it Backends may be empty.
	Discover string `yaml:"discover"`
	// KubeAPI is the Kubernetes API server's URL for a Kubernetes
	// Discover target and the endpoint picker's lease (no credentials
	// sent: kubectl proxy's, say); empty means the pod's in-cluster
	// configuration (service account token and CA).
	KubeAPI string `yaml:"kube-api"`
	// DiscoverInterval is how often Discover is resolved again; zero
	// means 10 s.
	DiscoverInterval time.Duration `yaml:"discover-interval"`
	// ConfigPollInterval is how often serve checks its --config file for
	// a change (then reloaded, as on SIGHUP); zero means 2 s, negative
	// never (SIGHUP only).
	ConfigPollInterval time.Duration `yaml:"config-poll-interval"`
	// Policy names the routing policy (route.Names()); empty means kv-aware.
	Policy string `yaml:"policy"`
	// SessionHeader is the request header that carries a session id.
	SessionHeader string `yaml:"session-header"`
	// Sessions bound a session to its replica (session-ttl,
	// max-sessions).
	fleet.Sessions `yaml:",inline"`
	// MaxBodyBytes caps a request body, in bytes; larger ones get 413.
	MaxBodyBytes int64 `yaml:"max-body-bytes"`
	// MaxBodyBytesTotal bounds the request bodies held in memory
	// together, bytes; a request past it gets 503 before its body is read.
	// Zero means DefaultBodyBudget (a 16th of the memory limit, at most 32
	// times MaxBodyBytes).
	MaxBodyBytesTotal int64 `yaml:"max-body-bytes-total"`
	// ChunkChars is the text-mode prefix block size, in characters.
	ChunkChars int `yaml:"chunk-chars"`
	// ScrapeInterval is how often each replica's /metrics is read.
	ScrapeInterval time.Duration `yaml:"scrape-interval"`
	// ScrapeIdleInterval is the longest gap between scrapes of an idle
	// replica (scrape.Scraper.IdleInterval): one whose load metrics did
	// not change and that the router sent nothing since. Zero, or not
	// more than ScrapeInterval, means no backoff.
	ScrapeIdleInterval time.Duration `yaml:"scrape-idle-interval"`
	// HealthInterval is how often each replica's /health is probed.
	HealthInterval time.Duration `yaml:"health-interval"`
	// HealthPath is the path probed; empty means /health. A replica that
	// answers it 404 is probed at /v1/models instead, and one without
	// either is judged by its requests' outcomes alone (package health).
	HealthPath string `yaml:"health-path"`
	// ModelsInterval is how often each replica's /v1/models is read again
	// (the models it serves, LoRA adapters with their base); they are
	// read once at start. Zero means 10 s.
	ModelsInterval time.Duration `yaml:"models-interval"`
	// Decisions is how many recent decisions /debug/decisions keeps.
	Decisions int `yaml:"decisions"`
	// Preset names the engine preset the cost model's rates start from.
	Preset string `yaml:"preset"`
	// TimeScale is the time scale the backends' engines run at, in wall
	// seconds per engine second, as emulated fleets do (kvrouter engine
	// --time-scale, the demo): every duration of the preset's rates is
	// multiplied by it, so that the cost model's predicted times are wall
	// times of these engines from the start. 1 for real engines; zero
	// means 1. Calibration (Rates.Scale from TTFTs, Rates.DecodeScale
	// from inter-token latencies, each within 1/1024..1024) then only
	// corrects what remains.
	TimeScale float64 `yaml:"time-scale"`
	// CacheBlocks is each replica's KV capacity in blocks when its metrics do
	// not report one; zero means the preset's.
	CacheBlocks int `yaml:"cache-blocks"`
	// Retries is how many other replicas a request may be retried on before
	// its first byte reaches the client.
	Retries int `yaml:"retries"`
	// LogLevel is debug, info, warn or error.
	LogLevel string `yaml:"log-level"`
	// LogFormat is how log lines are written: text (slog's key=value) or
	// json (one JSON object per line); empty means text.
	LogFormat string `yaml:"log-format"`
	// OTLPEndpoint is the OpenTelemetry collector's OTLP/HTTP base URL
	// (http://host:4318; spans go to its /v1/traces), as
	// OTEL_EXPORTER_OTLP_ENDPOINT, over which it takes precedence. Empty
	// means tracing is off unless OTEL_EXPORTER_OTLP_ENDPOINT or
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set (package tracing).
	OTLPEndpoint string `yaml:"otlp-endpoint"`
	// KVEventsBind is the endpoint of one ZMQ SUB socket that engines dial
	// to publish their KV events (e.g. "tcp://0.0.0.0:5557"); an engine is
	// matched to the backend whose host:port its topic
	// "kv@<host>:<port>@<model>" names. Empty means no bind socket. With it,
	// or with any backend's kv=, the router runs in precise mode.
	KVEventsBind string `yaml:"kv-events-bind"`
	// Tokenizer puts the router in token mode for every model: a directory
	// holding a Hugging Face tokenizer.json (and tokenizer_config.json for
	// the chat template), or "remote" to ask a healthy replica's POST
	// /tokenize. Empty means text mode, unless Tokenizers names the model.
	Tokenizer string `yaml:"tokenizer"`
	// Tokenizers maps a model name to its tokenizer (a directory or
	// "remote"), overriding Tokenizer for that model.
	Tokenizers map[string]string `yaml:"tokenizers"`

	// Admission is admission control: the router's queue of requests no
	// replica can start in time.
	Admission fleet.Admission `yaml:",inline"`
	// SLO is the requests' latency targets and what happens to a request
	// no replica is predicted to meet them for (slo.go).
	SLO SLOs `yaml:",inline"`

	// Safety surface (issue 13): drain, authentication, TLS, the admin
	// listener, what passes through and what decision records show.

	// DrainTimeout is how long the requests in flight at SIGTERM may run
	// on before the rest are ended (a streamed one with an SSE error
	// event); zero means they are ended at once.
	DrainTimeout time.Duration `yaml:"drain-timeout"`
	// APIKeys is a file of the keys a client must send as "Authorization:
	// Bearer KEY" on the API port (format: ReadKeys); empty means no
	// authentication.
	APIKeys string `yaml:"api-keys"`
	// AdminListen is the address of the admin surface (/ui, /debug/*,
	// /metrics, /livez, /readyz), host:port; empty means none.
	AdminListen string `yaml:"admin-listen"`
	// AdminAPIKeys is a file of the keys the admin surface asks for (as a
	// bearer token, or the password of HTTP basic authentication, for
	// browsers); empty means the admin surface asks for none.
	AdminAPIKeys string `yaml:"admin-api-keys"`
	// TLSCert and TLSKey are PEM files of the listeners' certificate
	// (chain) and private key; both empty means plain HTTP.
	TLSCert string `yaml:"tls-cert"`
	TLSKey  string `yaml:"tls-key"`
	// BackendCA is a PEM file of the certificate authorities https://
	// backends are verified against; empty means the system's roots.
	BackendCA string `yaml:"backend-ca"`
	// PassThrough are the path prefixes of requests other than the routed
	// ones that are forwarded to a replica ("/v1/audio/" matches below it,
	// "/tokenize" matches itself and below; "/" matches every path).
	// Empty means none: every other path is answered 404.
	PassThrough []string `yaml:"pass-through"`
	// DebugShowIDs shows session ids (and the OpenAI user values they may
	// come from) verbatim in decision records; false shows a keyed hash.
	DebugShowIDs bool `yaml:"debug-show-ids"`
	// ClientHeaders sends the routing headers (X-Kvrouter-Replica,
	// X-Kvrouter-Decision: the replica's URL, the decision's cost terms)
	// to every client; false, the default, sends them only to clients
	// whose API key says "headers=on" (clientheaders.go).
	ClientHeaders bool `yaml:"client-headers"`
	// Pprof serves Go's runtime profiles at /debug/pprof/ on the admin
	// surface (pprof.go); false, the default, serves none.
	Pprof bool `yaml:"pprof"`

	// Record writes every completed request to a trace file the simulator
	// reads (package record; recording.go); its Path empty means none.
	Record record.Config `yaml:",inline"`

	// KVEvents bound what the KV-event sockets may cost (issue 13:
	// hostile KV-event sockets).
	KVEvents kvevents.Limits `yaml:",inline"`

	// Limits: bounded memory per request and per client, server-side
	// timeouts, headers (issue 13). Every zero means the Default… below.

	// BodyLimits bound what a request body may hold (400 too_many_messages,
	// too_many_content_parts, nesting_too_deep, too_many_tools,
	// too_many_prompts past a limit).
	BodyLimits prefix.Limits `yaml:",inline"`
	// MaxHeaderBytes caps a request's header (request line included), in
	// bytes; larger ones get 431 from the server. Zero means
	// DefaultMaxHeaderBytes.
	MaxHeaderBytes int `yaml:"max-header-bytes"`
	// MaxHeaders is the most header fields a request may carry (431
	// too_many_headers); zero means DefaultMaxHeaders.
	MaxHeaders int `yaml:"max-headers"`
	// ReadHeaderTimeout is how long a client has to send a request's
	// header, from its first byte; zero means DefaultReadHeaderTimeout.
	ReadHeaderTimeout time.Duration `yaml:"read-header-timeout"`
	// BodyTimeout is how long a client has to send a request's body, from
	// the end of its header (408 body_timeout); zero means
	// DefaultBodyTimeout. It does not bound the response: streams run as
	// long as they last.
	BodyTimeout time.Duration `yaml:"body-timeout"`
	// IdleTimeout is how long a keep-alive connection may wait for its
	// next request before the router closes it; zero means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration `yaml:"idle-timeout"`
	// TrustedProxies are the peers (CIDR prefixes) whose X-Forwarded-For,
	// X-Forwarded-*, and X-Real-IP headers are passed on (the peer's
	// address appended to X-Forwarded-For); from any other peer they are
	// dropped and X-Forwarded-For is the peer alone. Empty means none.
	TrustedProxies Prefixes `yaml:"trusted-proxies"`

	// Upstream safety: timeouts, retry until the first token, stream
	// continuation, outlier ejection.

	// ConnectTimeout bounds connecting to a replica; zero means the
	// system's limit only.
	ConnectTimeout time.Duration `yaml:"upstream-connect-timeout"`
	// TTFTTimeout bounds the wait for a streamed response's headers and
	// first content event; past it the attempt fails and is retried on
	// another replica (nothing reached the client). Zero means no limit.
	TTFTTimeout time.Duration `yaml:"ttft-timeout"`
	// LegTimeout bounds a prefill leg (a prompt's prefill and one token on
	// a prefill worker), within TTFTTimeout: past it the leg fails as a
	// timeout, counts against the worker's health, and the request is
	// decided again without it. Zero means TTFTTimeout alone.
	LegTimeout time.Duration `yaml:"leg-timeout"`
	// StreamIdleTimeout bounds the silence of a stream after its first
	// token: a replica that sends no byte for that long counts as dead,
	// and the stream is continued elsewhere or ends with an error event.
	// Zero means no limit.
	StreamIdleTimeout time.Duration `yaml:"stream-idle-timeout"`
	// RequestTimeout bounds a whole request from its arrival, retries and
	// continuations included: the client then gets a 504 or, once its
	// stream started, a final error event. Zero means no limit.
	RequestTimeout time.Duration `yaml:"request-timeout"`
	// StreamContinue continues a stream whose replica fails after its
	// first token on another replica (chat: continue_final_message;
	// completions: prompt plus text), at most Retries times; false ends it
	// with an SSE error event.
	StreamContinue bool `yaml:"stream-continue"`
	// KVTransfer lets decisions order KV imports from a replica that
	// holds the prompt's prefix, run as vLLM's two legs: a prefill leg on
	// the holder, whose kv_transfer_params the request then carries to
	// its replica (transfer.go). Only engines with a KV connector
	// (NixlConnector, kvrouter's emulator) can act on it. A fleet with
	// prefill workers (Backend.Role) needs it: their legs hand the KV over
	// the same links.
	KVTransfer bool `yaml:"kv-transfer"`
	// InterconnectGBps is the replicas' link bandwidth in GB/s each way,
	// which the cost model prices transfers at; zero means the preset's
	// (50 GB/s per GPU).
	InterconnectGBps float64 `yaml:"interconnect-gbps"`
	// RetryBufferBytes is the largest non-streaming response read whole
	// before the client gets a byte of it, so that a failure while reading
	// it is retried; larger ones pass through past that point. Zero means
	// none is buffered.
	RetryBufferBytes int64 `yaml:"retry-buffer-bytes"`
	// Outlier ejects a replica whose requests fail in a row (package
	// health).
	Outlier health.Outlier `yaml:",inline"`

	// Several routers (package peers).

	// Peers are the Redis server through which several routers share
	// sessions, in-flight load and routed blocks, and its timing; an empty
	// Peers.URL means this router decides alone.
	Peers peers.Settings `yaml:",inline"`
}

// policyName is Policy, or the default.
func (c *Config) policyName() string {
	if c.Policy == "" {
		return route.Default
	}
	return c.Policy
}

// Remote is the Tokenizer value that asks the replicas' /tokenize.
const Remote = hashing.Remote

// legTimeout is a prefill leg's limit: the least of LegTimeout and
// TTFTTimeout that are set; zero: none.
func (c *Config) legTimeout() time.Duration {
	switch {
	case c.LegTimeout <= 0:
		return c.TTFTTimeout
	case c.TTFTTimeout <= 0:
		return c.LegTimeout
	}
	return min(c.LegTimeout, c.TTFTTimeout)
}

// Precise reports whether the configuration asks for KV events: a bind
// address or a backend with kv=.
func (c *Config) Precise() bool {
	if c.KVEventsBind != "" {
		return true
	}
	for _, b := range c.Backends {
		if b.KV != "" {
			return true
		}
	}
	return false
}

// TokenMode reports whether any model is tokenized (locally or remotely).
func (c *Config) TokenMode() bool { return c.Tokenizer != "" || len(c.Tokenizers) > 0 }

// Defaults of Config, also shown in flag help.
const (
	DefaultListen         = "127.0.0.1:8000"
	DefaultSessionHeader  = "X-Session-ID"
	DefaultMaxBodyBytes   = 8 << 20
	DefaultChunkChars     = 64
	DefaultScrapeInterval = 100 * time.Millisecond
	DefaultHealthInterval = time.Second
	// DefaultScrapeIdleInterval keeps an idle replica's load younger
	// than a second, the age past which kv-aware ignores it.
	DefaultScrapeIdleInterval = 500 * time.Millisecond
	DefaultDecisions          = 1024
	DefaultRetries            = 2
	DefaultLogLevel           = "info"

	// DefaultDrainTimeout is how long in-flight requests may finish after
	// SIGTERM.
	DefaultDrainTimeout = 60 * time.Second
	// DefaultAdminListen keeps the admin surface on loopback: reachable
	// from the host (a sidecar, an operator's browser), not the network.
	DefaultAdminListen = "127.0.0.1:9091"
	// DefaultPassThrough are the paths an OpenAI (or vLLM) client uses
	// besides the routed ones; the engines' admin paths (/sleep,
	// /collective_rpc, /v1/load_lora_adapter, /reset_prefix_cache, ...)
	// are not among them. POST /v1/responses is routed; below it a
	// stored response's own paths (GET and DELETE /v1/responses/{id})
	// pass through, to the replica that holds it.
	DefaultPassThrough = "/v1/models,/v1/embeddings,/v1/audio/,/v1/responses/,/v1/score,/v1/rerank,/v2/rerank,/rerank,/score," +
		"/pooling,/classify,/tokenize,/detokenize,/version"

	DefaultMaxHeaderBytes    = 64 << 10
	DefaultMaxHeaders        = 100
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultBodyTimeout       = 30 * time.Second
	DefaultIdleTimeout       = 90 * time.Second

	DefaultConnectTimeout    = 3 * time.Second
	DefaultTTFTTimeout       = 60 * time.Second
	DefaultLegTimeout        = 15 * time.Second
	DefaultStreamIdleTimeout = 30 * time.Second
	DefaultRequestTimeout    = 15 * time.Minute
	DefaultRetryBufferBytes  = 1 << 20
)

// DefaultConfig returns the configuration used where nothing else is said.
// It has no backends.
func DefaultConfig() Config {
	return Config{
		Listen:             DefaultListen,
		Policy:             route.Default,
		SessionHeader:      DefaultSessionHeader,
		MaxBodyBytes:       DefaultMaxBodyBytes,
		ChunkChars:         DefaultChunkChars,
		ScrapeInterval:     DefaultScrapeInterval,
		ScrapeIdleInterval: DefaultScrapeIdleInterval,
		HealthInterval:     DefaultHealthInterval,
		Decisions:          DefaultDecisions,
		Preset:             engine.DefaultPreset,
		Retries:            DefaultRetries,
		LogLevel:           DefaultLogLevel,
		LogFormat:          LogText,
		Sessions:           fleet.Sessions{SessionTTL: fleet.DefaultSessionTTL, MaxSessions: fleet.DefaultMaxSessions},
		Admission: fleet.Admission{
			MaxWait: fleet.DefaultMaxWait, MaxQueue: fleet.DefaultMaxQueue, QueueTimeout: fleet.DefaultQueueTimeout,
		},
		SLO: SLOs{Admission: SLOAdmitRoute},

		DrainTimeout: DefaultDrainTimeout,
		AdminListen:  DefaultAdminListen,
		PassThrough:  strings.Split(DefaultPassThrough, ","),

		KVEvents:   kvevents.DefaultLimits(),
		BodyLimits: prefix.DefaultLimits(),

		MaxHeaderBytes:    DefaultMaxHeaderBytes,
		MaxHeaders:        DefaultMaxHeaders,
		ReadHeaderTimeout: DefaultReadHeaderTimeout,
		BodyTimeout:       DefaultBodyTimeout,
		IdleTimeout:       DefaultIdleTimeout,

		ConnectTimeout:    DefaultConnectTimeout,
		TTFTTimeout:       DefaultTTFTTimeout,
		LegTimeout:        DefaultLegTimeout,
		StreamIdleTimeout: DefaultStreamIdleTimeout,
		RequestTimeout:    DefaultRequestTimeout,
		StreamContinue:    true,
		RetryBufferBytes:  DefaultRetryBufferBytes,
		Outlier:           health.DefaultOutlier(),
	}
}

// ReadConfigFile overlays the YAML file at path on cfg. Keys are the flag
// names; unknown keys are errors. The backends may also be given under
// "backends" (not both).
func ReadConfigFile(path string, cfg *Config) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return DecodeConfig(path, data, cfg)
}

// DecodeConfig is ReadConfigFile of the file path's contents data.
func DecodeConfig(path string, data []byte, cfg *Config) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var file struct {
		Config   `yaml:",inline"`
		Backends []Backend `yaml:"backends"`
	}
	file.Config = *cfg
	file.Config.Backends = nil
	if err := dec.Decode(&file); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("config %s: %w", path, err)
	}
	switch {
	case file.Config.Backends != nil && file.Backends != nil:
		return fmt.Errorf("config %s: both backend and backends are set: use one", path)
	case file.Backends != nil:
		file.Config.Backends = file.Backends
	case file.Config.Backends == nil:
		file.Config.Backends = cfg.Backends
	}
	*cfg = file.Config
	return nil
}

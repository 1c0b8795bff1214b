package proxy

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/hashing"
	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/residency"
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
	// Discover is a DNS name whose records are the backends
	// (dns://name:port, dns+srv://_service._proto.name; package
	// discover); empty means none. With it Backends may be empty.
	Discover string `yaml:"discover"`
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
	// SessionTTL is how long an idle session stays bound to its replica;
	// zero means fleet.DefaultSessionTTL (10 min).
	SessionTTL time.Duration `yaml:"session-ttl"`
	// MaxBodyBytes caps a request body, in bytes; larger ones get 413.
	MaxBodyBytes int64 `yaml:"max-body-bytes"`
	// ChunkChars is the text-mode prefix block size, in characters.
	ChunkChars int `yaml:"chunk-chars"`
	// ScrapeInterval is how often each replica's /metrics is read.
	ScrapeInterval time.Duration `yaml:"scrape-interval"`
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

	// Admission control (fleet.Admission). MaxWait is the predicted wait
	// before its prefill starts past which a replica takes no more
	// requests: when every replica is past it, a request waits in the
	// router's queue (the X-Priority header's highest first, then the
	// oldest) for up to QueueTimeout, and MaxQueue of them at most; past
	// those limits it gets 429 with Retry-After. Zero MaxWait turns it
	// off; zero MaxQueue and QueueTimeout mean fleet's defaults.
	MaxWait      time.Duration `yaml:"max-wait"`
	MaxQueue     int           `yaml:"max-queue"`
	QueueTimeout time.Duration `yaml:"queue-timeout"`

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

	// KV-event input limits (issue 13: hostile KV-event sockets).

	// KVEventsAllow lists, comma-separated, the peers besides each
	// backend's own host (its URL's host) that may publish on
	// KVEventsBind: CIDRs ("10.0.0.0/8"), IP addresses, host names, or
	// "*" for any. Empty means each backend's own host only.
	KVEventsAllow string `yaml:"kv-events-allow"`
	// KVEventsMaxMessageBytes bounds one KV-event or replay message,
	// checked on each frame header before the frame is read; a larger
	// claim closes the connection. Zero means 16 MiB.
	KVEventsMaxMessageBytes int64 `yaml:"kv-events-max-message-bytes"`
	// KVEventsMaxReplayBytes bounds the payload of one replay. Zero means
	// 256 MiB.
	KVEventsMaxReplayBytes int64 `yaml:"kv-events-max-replay-bytes"`
	// KVEventsMaxQueueBytes bounds the KV-event bytes queued for one
	// replica; past it messages are dropped (a gap, replayed). Zero means
	// 64 MiB.
	KVEventsMaxQueueBytes int64 `yaml:"kv-events-max-queue-bytes"`
	// KVEventsMaxConns bounds the open connections on KVEventsBind. Zero
	// means 256.
	KVEventsMaxConns int `yaml:"kv-events-max-conns"`
	// KVEventsHandshakeTimeout bounds a KV-event connection's connect and
	// ZMTP handshake. Zero means 5 s.
	KVEventsHandshakeTimeout time.Duration `yaml:"kv-events-handshake-timeout"`
	// KVEventsReadTimeout bounds the reading of one KV-event message once
	// its first byte arrived. Zero means 30 s.
	KVEventsReadTimeout time.Duration `yaml:"kv-events-read-timeout"`
	// KVEventsMaxSeqJump is the largest sequence gap taken as lost
	// batches; a batch further ahead is not applied unless the next one
	// continues from it. Zero means 1,000,000.
	KVEventsMaxSeqJump uint64 `yaml:"kv-events-max-seq-jump"`

	// Limits: bounded memory per request and per client, server-side
	// timeouts, headers (issue 13). Every zero means the Default… below.

	// MaxMessages is the most chat messages a request may carry (400
	// too_many_messages past it); zero means DefaultMaxMessages, negative
	// no limit.
	MaxMessages int `yaml:"max-messages"`
	// MaxContentParts is the most content parts of a request's messages
	// together (400 too_many_content_parts); zero means
	// DefaultMaxContentParts, negative no limit.
	MaxContentParts int `yaml:"max-content-parts"`
	// MaxJSONDepth is the deepest nesting of objects and arrays in a
	// request body, the body's own object counting 1 (400
	// nesting_too_deep); zero means DefaultMaxJSONDepth, negative
	// prefix.HardMaxDepth.
	MaxJSONDepth int `yaml:"max-json-depth"`
	// MaxTools is the most entries of a request's "tools" (400
	// too_many_tools); zero means DefaultMaxTools, negative no limit.
	MaxTools int `yaml:"max-tools"`
	// MaxPrompts is the most prompts of a completions batch (400
	// too_many_prompts); zero means DefaultMaxPrompts, negative no limit.
	MaxPrompts int `yaml:"max-prompts"`
	// MaxSessions is the most sessions bound to a replica at once, the
	// least recently used dropped past it; zero means
	// fleet.DefaultMaxSessions. Session ids longer than
	// fleet.MaxSessionIDBytes are kept as a hash.
	MaxSessions int `yaml:"max-sessions"`
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
	// KVTransfer lets decisions order KV transfers between replicas: the
	// forwarded body then carries vLLM's kv_transfer_params naming the
	// source (transfer.go). Only engines with a KV connector (NIXL,
	// LMCache, kvrouter's emulator) can act on it; false never sends it.
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
	// EjectConsecutive is the number of failed requests in a row that
	// eject a replica; zero means 5.
	EjectConsecutive int `yaml:"eject-consecutive"`
	// EjectBase is a first ejection's duration, doubled for each ejection
	// in a row; zero means 1 s.
	EjectBase time.Duration `yaml:"eject-base"`
	// EjectMax caps an ejection, and is how long a replica must stay in
	// service for its ejection count to reset; zero means 30 s.
	EjectMax time.Duration `yaml:"eject-max"`

	// Several routers (package peers).

	// Redis is the URL of the Redis server through which several routers
	// share sessions, in-flight load and routed blocks
	// (redis://host:port[/db]); empty means this router decides alone.
	Redis string `yaml:"redis"`
	// SyncInterval is how often the shared state is published and read;
	// zero means peers.DefaultInterval (50 ms).
	SyncInterval time.Duration `yaml:"sync-interval"`
	// SharedTTL is how long a router's load counts after its last
	// publication (a router that died); zero means 20 sync intervals, at
	// least 1 s.
	SharedTTL time.Duration `yaml:"shared-ttl"`
	// RouterID names this router among its peers; empty means a random
	// id.
	RouterID string `yaml:"router-id"`
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

// Backend is one replica: its base URL and optional extra endpoints, written
// as "http://h:8000,kv=tcp://h:5557,replay=tcp://h:5558".
type Backend struct {
	// URL is the replica's OpenAI-compatible base URL (scheme://host:port).
	URL string
	// KV is the replica's KV-event publisher endpoint (precise mode); empty
	// means none.
	KV string
	// Replay is the replica's KV-event replay endpoint; empty means none.
	Replay string
	// Models are the model names the replica serves (option model=,
	// repeatable). Empty means the ones its GET /v1/models lists,
	// refreshed. The first is also the model its KV events are keyed
	// under when the engine's topic "kv@<host>:<port>@<model>" does not
	// name one.
	Models []string
}

// Defaults of Config, also shown in flag help.
const (
	DefaultListen         = "127.0.0.1:8000"
	DefaultPolicy         = "kv-aware"
	DefaultSessionHeader  = "X-Session-ID"
	DefaultSessionTTL     = 10 * time.Minute
	DefaultMaxBodyBytes   = 8 << 20
	DefaultChunkChars     = 64
	DefaultScrapeInterval = 100 * time.Millisecond
	DefaultHealthInterval = time.Second
	DefaultDecisions      = 1024
	DefaultPreset         = "llama3-8b-h100"
	DefaultRetries        = 2
	DefaultLogLevel       = "info"

	// DefaultDrainTimeout is how long in-flight requests may finish after
	// SIGTERM.
	DefaultDrainTimeout = 60 * time.Second
	// DefaultAdminListen keeps the admin surface on loopback: reachable
	// from the host (a sidecar, an operator's browser), not the network.
	DefaultAdminListen = "127.0.0.1:9091"
	// DefaultPassThrough are the paths an OpenAI (or vLLM) client uses
	// besides the routed ones; the engines' admin paths (/sleep,
	// /collective_rpc, /v1/load_lora_adapter, /reset_prefix_cache, ...)
	// are not among them.
	DefaultPassThrough = "/v1/models,/v1/embeddings,/v1/audio/,/v1/responses,/v1/score,/v1/rerank,/v2/rerank,/rerank,/score," +
		"/pooling,/classify,/tokenize,/detokenize,/version"

	// Limits (issue 13).
	DefaultMaxMessages       = prefix.DefaultMaxMessages
	DefaultMaxContentParts   = prefix.DefaultMaxParts
	DefaultMaxJSONDepth      = prefix.DefaultMaxDepth
	DefaultMaxTools          = prefix.DefaultMaxTools
	DefaultMaxPrompts        = prefix.DefaultMaxPrompts
	DefaultMaxSessions       = fleet.DefaultMaxSessions
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultMaxHeaders        = 100
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultBodyTimeout       = 30 * time.Second
	DefaultIdleTimeout       = 90 * time.Second

	DefaultConnectTimeout    = 3 * time.Second
	DefaultTTFTTimeout       = 60 * time.Second
	DefaultStreamIdleTimeout = 30 * time.Second
	DefaultRequestTimeout    = 15 * time.Minute
	DefaultRetryBufferBytes  = 1 << 20
	DefaultEjectConsecutive  = 5
	DefaultEjectBase         = time.Second
	DefaultEjectMax          = 30 * time.Second
)

// DefaultConfig returns the configuration used where nothing else is said.
// It has no backends.
func DefaultConfig() Config {
	return Config{
		Listen:         DefaultListen,
		Policy:         DefaultPolicy,
		SessionHeader:  DefaultSessionHeader,
		SessionTTL:     DefaultSessionTTL,
		MaxBodyBytes:   DefaultMaxBodyBytes,
		ChunkChars:     DefaultChunkChars,
		ScrapeInterval: DefaultScrapeInterval,
		HealthInterval: DefaultHealthInterval,
		Decisions:      DefaultDecisions,
		Preset:         DefaultPreset,
		Retries:        DefaultRetries,
		LogLevel:       DefaultLogLevel,
		LogFormat:      LogText,
		MaxWait:        fleet.DefaultMaxWait,
		MaxQueue:       fleet.DefaultMaxQueue,
		QueueTimeout:   fleet.DefaultQueueTimeout,

		DrainTimeout: DefaultDrainTimeout,
		AdminListen:  DefaultAdminListen,
		PassThrough:  strings.Split(DefaultPassThrough, ","),

		KVEventsMaxMessageBytes:  16 << 20,
		KVEventsMaxReplayBytes:   256 << 20,
		KVEventsMaxQueueBytes:    64 << 20,
		KVEventsMaxConns:         256,
		KVEventsHandshakeTimeout: 5 * time.Second,
		KVEventsReadTimeout:      30 * time.Second,
		KVEventsMaxSeqJump:       1_000_000,

		MaxMessages:       DefaultMaxMessages,
		MaxContentParts:   DefaultMaxContentParts,
		MaxJSONDepth:      DefaultMaxJSONDepth,
		MaxTools:          DefaultMaxTools,
		MaxPrompts:        DefaultMaxPrompts,
		MaxSessions:       DefaultMaxSessions,
		MaxHeaderBytes:    DefaultMaxHeaderBytes,
		MaxHeaders:        DefaultMaxHeaders,
		ReadHeaderTimeout: DefaultReadHeaderTimeout,
		BodyTimeout:       DefaultBodyTimeout,
		IdleTimeout:       DefaultIdleTimeout,

		ConnectTimeout:    DefaultConnectTimeout,
		TTFTTimeout:       DefaultTTFTTimeout,
		StreamIdleTimeout: DefaultStreamIdleTimeout,
		RequestTimeout:    DefaultRequestTimeout,
		StreamContinue:    true,
		RetryBufferBytes:  DefaultRetryBufferBytes,
		EjectConsecutive:  DefaultEjectConsecutive,
		EjectBase:         DefaultEjectBase,
		EjectMax:          DefaultEjectMax,
	}
}

// ParseBackend parses "URL[,kv=ENDPOINT][,replay=ENDPOINT][,model=NAME]...".
func ParseBackend(s string) (Backend, error) {
	parts := strings.Split(strings.TrimSpace(s), ",")
	b := Backend{URL: strings.TrimRight(strings.TrimSpace(parts[0]), "/")}
	if err := checkURL(b.URL); err != nil {
		return Backend{}, fmt.Errorf("backend %q: %w", s, err)
	}
	for _, opt := range parts[1:] {
		k, v, ok := strings.Cut(strings.TrimSpace(opt), "=")
		if !ok || v == "" {
			return Backend{}, fmt.Errorf("backend %q: option %q is not key=value", s, opt)
		}
		switch k {
		case "kv":
			b.KV = v
		case "replay":
			b.Replay = v
		case "model":
			b.Models = append(b.Models, v)
		default:
			return Backend{}, fmt.Errorf("backend %q: unknown option %q (known: kv, replay, model)", s, k)
		}
	}
	return b, nil
}

// checkURL checks a backend's base URL, with a message that says how to
// fix it: a scheme (http:// or https://) and a host are needed, and the
// path must not end in /v1 (the router appends each request's own path).
func checkURL(s string) error {
	if !strings.Contains(s, "://") {
		return fmt.Errorf("URL needs a scheme, e.g. http://%s", s)
	}
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("scheme must be http or https, got %q", u.Scheme)
	}
	if u.Hostname() == "" {
		return errors.New("no host")
	}
	if p := strings.TrimRight(u.Path, "/"); strings.HasSuffix(p, "/v1") {
		return fmt.Errorf("give the server's base URL, without /v1 (the router appends each request's path), e.g. %s://%s%s", u.Scheme, u.Host, strings.TrimSuffix(p, "/v1"))
	}
	return nil
}

// String renders b in the form ParseBackend reads.
func (b Backend) String() string {
	s := b.URL
	if b.KV != "" {
		s += ",kv=" + b.KV
	}
	if b.Replay != "" {
		s += ",replay=" + b.Replay
	}
	for _, m := range b.Models {
		s += ",model=" + m
	}
	return s
}

// UnmarshalYAML reads a backend from its string form
// ("http://a:8000,kv=tcp://a:5557,model=m") or from a mapping with the
// keys url, kv, replay and models (a list, or one name).
func (b *Backend) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		var s string
		if err := n.Decode(&s); err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		v, err := ParseBackend(s)
		if err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		*b = v
		return nil
	case yaml.MappingNode:
		return b.unmarshalMapping(n)
	}
	return fmt.Errorf("line %d: a backend is a string like http://host:port[,kv=...] or a mapping with url, kv, replay, models", n.Line)
}

// unmarshalMapping reads the mapping form of a backend: unknown keys are
// errors, url is required and checked as --backend's is.
func (b *Backend) unmarshalMapping(n *yaml.Node) error {
	var v Backend
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		var err error
		switch k.Value {
		case "url":
			err = val.Decode(&v.URL)
			v.URL = strings.TrimRight(strings.TrimSpace(v.URL), "/")
		case "kv":
			err = val.Decode(&v.KV)
		case "replay":
			err = val.Decode(&v.Replay)
		case "models", "model":
			if val.Kind == yaml.ScalarNode {
				var m string
				err = val.Decode(&m)
				v.Models = append(v.Models, m)
			} else {
				err = val.Decode(&v.Models)
			}
		default:
			return fmt.Errorf("line %d: backend: unknown key %q (known: url, kv, replay, models)", k.Line, k.Value)
		}
		if err != nil {
			return fmt.Errorf("line %d: backend %s: %w", val.Line, k.Value, err)
		}
	}
	if v.URL == "" {
		return fmt.Errorf("line %d: backend: url is required", n.Line)
	}
	if err := checkURL(v.URL); err != nil {
		return fmt.Errorf("line %d: backend %q: %w", n.Line, v.URL, err)
	}
	*b = v
	return nil
}

// MarshalYAML writes a backend in its string form.
func (b Backend) MarshalYAML() (any, error) { return b.String(), nil }

// ReadConfigFile overlays the YAML file at path on cfg. Keys are the flag
// names; unknown keys are errors. The backends may also be given under
// "backends" (not both).
func ReadConfigFile(path string, cfg *Config) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	dec := yaml.NewDecoder(f)
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

// Validate checks cfg once, with messages that name the setting.
func (c *Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("listen %q: %w", c.Listen, err))
	}
	if len(c.Backends) == 0 && c.Discover == "" {
		errs = append(errs, errors.New("backend: at least one is needed (--backend http://host:port)"))
	}
	if !(c.InterconnectGBps >= 0 && c.InterconnectGBps <= 1e6) {
		errs = append(errs, fmt.Errorf("interconnect-gbps %g: want 0 (the preset's) up to 1e6", c.InterconnectGBps))
	}
	seen := map[string]bool{}
	for _, b := range c.Backends {
		if err := checkURL(b.URL); err != nil {
			errs = append(errs, fmt.Errorf("backend %q: %w", b.URL, err))
		}
		if seen[b.URL] {
			errs = append(errs, fmt.Errorf("backend %q: listed twice", b.URL))
		}
		seen[b.URL] = true
	}
	if _, err := route.New(c.policyName()); err != nil {
		errs = append(errs, fmt.Errorf("policy: %w", err))
	}
	if c.SessionHeader == "" {
		errs = append(errs, errors.New("session-header: must not be empty"))
	}
	positive := []struct {
		name string
		v    int64
	}{
		{"max-body-bytes", c.MaxBodyBytes},
		{"chunk-chars", int64(c.ChunkChars)},
		{"scrape-interval", int64(c.ScrapeInterval)},
		{"health-interval", int64(c.HealthInterval)},
		{"decisions", int64(c.Decisions)},
	}
	for _, p := range positive {
		if p.v <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be positive, got %d", p.name, p.v))
		}
	}
	if c.HealthPath != "" && !strings.HasPrefix(c.HealthPath, "/") {
		errs = append(errs, fmt.Errorf("health-path %q: must start with /", c.HealthPath))
	}
	if c.ModelsInterval < 0 {
		errs = append(errs, fmt.Errorf("models-interval: must not be negative, got %s", c.ModelsInterval))
	}
	if c.SessionTTL < 0 {
		errs = append(errs, fmt.Errorf("session-ttl: must not be negative, got %s", c.SessionTTL))
	}
	if len(c.Backends) > residency.MaxReplicasLimit {
		errs = append(errs, fmt.Errorf("backend: at most %d, got %d", residency.MaxReplicasLimit, len(c.Backends)))
	}
	if c.MaxBackends < 0 || c.MaxBackends > residency.MaxReplicasLimit || (c.MaxBackends > 0 && c.MaxBackends < len(c.Backends)) {
		errs = append(errs, fmt.Errorf("max-backends: want %d..%d (at least the backends given), got %d", len(c.Backends), residency.MaxReplicasLimit, c.MaxBackends))
	}
	if c.DiscoverInterval < 0 {
		errs = append(errs, fmt.Errorf("discover-interval: must not be negative, got %s", c.DiscoverInterval))
	}
	if c.TimeScale < 0 || math.IsNaN(c.TimeScale) || math.IsInf(c.TimeScale, 0) {
		errs = append(errs, fmt.Errorf("time-scale: must be a positive number (1 for real engines), got %v", c.TimeScale))
	}
	if c.CacheBlocks < 0 {
		errs = append(errs, fmt.Errorf("cache-blocks: must not be negative, got %d", c.CacheBlocks))
	}
	if c.Retries < 0 {
		errs = append(errs, fmt.Errorf("retries: must not be negative, got %d", c.Retries))
	}
	if c.MaxWait < 0 || c.MaxQueue < 0 || c.QueueTimeout < 0 {
		errs = append(errs, fmt.Errorf("max-wait, max-queue, queue-timeout: must not be negative, got %s, %d, %s", c.MaxWait, c.MaxQueue, c.QueueTimeout))
	}
	if _, err := ParseLogLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.validateTelemetry()...)
	errs = append(errs, c.validateKV()...)
	errs = append(errs, c.validateSurface()...)
	errs = append(errs, c.validateLimits()...)

	errs = append(errs, c.validateUpstream()...)
	return errors.Join(errs...)
}

// validateUpstream checks the timeouts and the ejection settings: none
// may be negative.
func (c *Config) validateUpstream() []error {
	var errs []error
	for _, p := range []struct {
		name string
		v    int64
	}{
		{"upstream-connect-timeout", int64(c.ConnectTimeout)},
		{"ttft-timeout", int64(c.TTFTTimeout)},
		{"stream-idle-timeout", int64(c.StreamIdleTimeout)},
		{"request-timeout", int64(c.RequestTimeout)},
		{"retry-buffer-bytes", c.RetryBufferBytes},
		{"eject-consecutive", int64(c.EjectConsecutive)},
		{"eject-base", int64(c.EjectBase)},
		{"eject-max", int64(c.EjectMax)},
	} {
		if p.v < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative, got %d", p.name, p.v))
		}
	}
	return errs
}

// validateKV checks the precise-mode and token-mode settings.
func (c *Config) validateKV() []error {
	var errs []error
	if c.KVEventsBind != "" {
		if err := checkEndpoint(c.KVEventsBind); err != nil {
			errs = append(errs, fmt.Errorf("kv-events-bind %q: %w", c.KVEventsBind, err))
		}
	}
	for _, b := range c.Backends {
		for _, e := range []struct{ opt, v string }{{"kv", b.KV}, {"replay", b.Replay}} {
			if e.v == "" {
				continue
			}
			if err := checkEndpoint(e.v); err != nil {
				errs = append(errs, fmt.Errorf("backend %q: %s=%q: %w", b.URL, e.opt, e.v, err))
			}
		}
		if b.Replay != "" && b.KV == "" && c.KVEventsBind == "" {
			errs = append(errs, fmt.Errorf("backend %q: replay= needs kv= or --kv-events-bind", b.URL))
		}
	}
	if c.Precise() && !c.TokenMode() {
		errs = append(errs, errors.New("kv events (kv= or kv-events-bind) need token mode, the engines' own tokens: "+
			"set --tokenizer DIR (the model's tokenizer.json and tokenizer_config.json) or --tokenizer remote (ask the replicas' /tokenize)"))
	}
	check := func(name, v string) {
		if v == "" || v == Remote {
			return
		}
		if _, err := os.Stat(filepath.Join(v, "tokenizer.json")); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: want %q or a directory holding tokenizer.json: %w", name, v, Remote, err))
		}
	}
	check("tokenizer", c.Tokenizer)
	for m, v := range c.Tokenizers {
		if m == "" || v == "" {
			errs = append(errs, fmt.Errorf("tokenizers: model %q: name and tokenizer must not be empty", m))
			continue
		}
		check("tokenizers["+m+"]", v)
	}
	return errs
}

// checkEndpoint accepts the ZMQ transports engines publish on.
func checkEndpoint(s string) error {
	for _, p := range []string{"tcp://", "ipc://", "inproc://"} {
		if strings.HasPrefix(s, p) && len(s) > len(p) {
			return nil
		}
	}
	return errors.New("want a ZMQ endpoint tcp://host:port, ipc://path or inproc://name")
}

// Log formats, the values of Config.LogFormat.
const (
	LogText = "text"
	LogJSON = "json"
)

// validateTelemetry checks the log format and the OTLP endpoint.
func (c *Config) validateTelemetry() []error {
	var errs []error
	switch c.LogFormat {
	case "", LogText, LogJSON:
	default:
		errs = append(errs, fmt.Errorf("log-format %q: want text or json", c.LogFormat))
	}
	if c.OTLPEndpoint != "" {
		if err := checkURL(c.OTLPEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("otlp-endpoint %q: %w (the collector's OTLP/HTTP base URL, e.g. http://localhost:4318)", c.OTLPEndpoint, err))
		}
	}
	return errs
}

// ParseLogLevel reads debug, info, warn or error.
func ParseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/proxy"
	"github.com/kvrouter/kvrouter/route"
)

// backendList is the repeatable --backend flag. The first Set after reset
// replaces the list (so flags replace the file's backends rather than add to
// them); later ones append.
type backendList struct {
	list    *[]proxy.Backend
	touched bool
}

func (b *backendList) String() string {
	if b.list == nil {
		return ""
	}
	s := make([]string, len(*b.list))
	for i, x := range *b.list {
		s[i] = x.String()
	}
	return strings.Join(s, " ")
}

// Set adds one backend, or several separated by spaces (the environment
// variable's form).
func (b *backendList) Set(s string) error {
	if !b.touched {
		*b.list = nil
		b.touched = true
	}
	for _, f := range strings.Fields(s) {
		v, err := proxy.ParseBackend(f)
		if err != nil {
			return err
		}
		*b.list = append(*b.list, v)
	}
	return nil
}

// serveFlags binds the serve flags to cfg.
func serveFlags(fs *flag.FlagSet, cfg *proxy.Config, configPath *string) *backendList {
	fs.StringVar(configPath, "config", "", "YAML config file (keys are the flag names; unknown keys are errors)")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "address to serve on, host:port")
	bl := &backendList{list: &cfg.Backends}
	fs.Var(bl, "backend", "replica base URL, repeatable: http://host:port[,kv=tcp://host:5557][,replay=tcp://host:5558][,model=NAME]...[,role=prefill|decode|both][,max_num_seqs=N][,engine=vllm|sglang|llamacpp] (model, repeatable: the models it serves, else those its /v1/models lists; the first also keys its KV events when its topic is not kv@<host>:<port>@<model>; role: its part in a prefill/decode-disaggregated fleet, default both, see docs/disaggregation.md; max_num_seqs: the engine's --max-num-seqs, else learned from its metrics: the sequences running over five scrapes in a row with requests waiting and others admitted as they leave, or a llama.cpp replica's slots from its /slots; engine: the engine it runs, else the one its /metrics shows, which decides how --tokenizer remote asks it, see docs/protocols.md#llamacpp)")
	fs.StringVar(&cfg.Policy, "policy", cfg.Policy, "routing policy: "+strings.Join(route.Names(), ", "))
	fs.StringVar(&cfg.SessionHeader, "session-header", cfg.SessionHeader, "request header carrying the session id")
	fs.DurationVar(&cfg.SessionTTL, "session-ttl", cfg.SessionTTL, "how long an idle session stays bound to its replica")
	fs.Int64Var(&cfg.MaxBodyBytes, "max-body-bytes", cfg.MaxBodyBytes, "largest request body accepted, bytes")
	fs.Int64Var(&cfg.MaxBodyBytesTotal, "max-body-bytes-total", cfg.MaxBodyBytesTotal, "bound of the request bodies held in memory together, bytes; past it a request gets 503 with Retry-After before its body is read (0: a 16th of the memory limit, cgroup or physical, at most 32 times --max-body-bytes)")
	fs.IntVar(&cfg.ChunkChars, "chunk-chars", cfg.ChunkChars, "prefix block size in characters (text mode)")
	fs.DurationVar(&cfg.ScrapeInterval, "scrape-interval", cfg.ScrapeInterval, "how often each replica's /metrics is read")
	fs.DurationVar(&cfg.ScrapeIdleInterval, "scrape-idle-interval", cfg.ScrapeIdleInterval, "longest gap between reads of an idle replica's /metrics (its load unchanged, no request sent to it since): reads back off to it, doubling, and return to --scrape-interval at the next tick once it has traffic or its load changes; 0 or not above --scrape-interval: no backoff; keep it under 1s, the age past which kv-aware ignores a load")
	fs.DurationVar(&cfg.HealthInterval, "health-interval", cfg.HealthInterval, "how often each replica's /health is probed")
	fs.StringVar(&cfg.HealthPath, "health-path", cfg.HealthPath, "path probed for each replica's health (empty: /health); a replica without it is probed at /v1/models, one without either judged by its requests alone")
	fs.DurationVar(&cfg.ModelsInterval, "models-interval", cfg.ModelsInterval, "how often each replica's /v1/models is read again (models it serves; read once at start)")
	fs.IntVar(&cfg.Decisions, "decisions", cfg.Decisions, "recent decisions kept for /debug/decisions")
	fs.StringVar(&cfg.Preset, "preset", cfg.Preset, "engine preset the cost model's rates start from")
	presetFileFlag(fs, &cfg.Preset)
	fs.Float64Var(&cfg.TimeScale, "time-scale", cfg.TimeScale, "wall seconds per engine second of emulated backends (kvrouter engine --time-scale): the cost model starts from the preset's rates times this (0: 1, real engines); calibration corrects the rest")
	fs.IntVar(&cfg.CacheBlocks, "cache-blocks", cfg.CacheBlocks, "replica KV capacity in blocks when its metrics do not say (0: the preset's)")
	fs.IntVar(&cfg.Retries, "retries", cfg.Retries, "other replicas tried before the first byte reaches the client")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	fs.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "log lines as text (key=value) or json (one object per line); the access log is one line per request at info")
	fs.StringVar(&cfg.OTLPEndpoint, "otlp-endpoint", cfg.OTLPEndpoint,
		"OpenTelemetry collector's OTLP/HTTP base URL (e.g. http://localhost:4318; spans to /v1/traces) or OTLP/gRPC address (grpc://localhost:4317, grpcs:// for TLS; or OTEL_EXPORTER_OTLP_PROTOCOL=grpc); empty: tracing off unless OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set")
	fs.StringVar(&cfg.KVEventsBind, "kv-events-bind", cfg.KVEventsBind,
		"ZMQ endpoint engines dial to publish KV events, matched to backends by topic kv@<host>:<port>@<model> (precise mode; e.g. tcp://0.0.0.0:5557)")
	admissionFlags(fs, &cfg.Admission.MaxWait, &cfg.Admission.MaxQueue, &cfg.Admission.QueueTimeout)
	sloFlags(fs, &cfg.SLO)
	dynamicFlags(fs, cfg)
	fs.StringVar(&cfg.Tokenizer, "tokenizer", cfg.Tokenizer,
		"token mode: a directory with the model's tokenizer.json and tokenizer_config.json, or \"remote\" to ask a healthy replica's /tokenize; empty: text mode (per model: YAML key tokenizers: {model: dir})")

	// Safety surface: drain, authentication, TLS, admin listener.
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout,
		"on SIGTERM/SIGINT, how long requests in flight may finish before the rest are ended with an error (exit code 1 then)")
	fs.StringVar(&cfg.APIKeys, "api-keys", cfg.APIKeys,
		"file of API keys clients must send as \"Authorization: Bearer KEY\" (one per line: \"KEY [NAME] [priority=N] [headers=on|off] [class=NAME]\"; # comments; class: one of --slo-classes); empty: no authentication")
	fs.StringVar(&cfg.AdminListen, "admin-listen", cfg.AdminListen,
		"address of the admin surface (/ui, /debug/decisions, /metrics, /livez, /readyz); empty: none")
	fs.StringVar(&cfg.AdminAPIKeys, "admin-api-keys", cfg.AdminAPIKeys,
		"file of the keys the admin surface asks for (bearer token, or basic-auth password in a browser); empty: none asked")
	fs.StringVar(&cfg.TLSCert, "tls-cert", cfg.TLSCert, "PEM certificate (chain) of the listeners; with --tls-key, they serve HTTPS")
	fs.StringVar(&cfg.TLSKey, "tls-key", cfg.TLSKey, "PEM private key of --tls-cert")
	fs.StringVar(&cfg.BackendCA, "backend-ca", cfg.BackendCA, "PEM certificate authorities https:// backends are verified against; empty: the system's")
	fs.Var(&pathList{list: &cfg.PassThrough}, "pass-through",
		"comma-separated path prefixes forwarded to a replica besides the routed ones (\"/\": every path; empty: none); others get 404")
	fs.BoolVar(&cfg.DebugShowIDs, "debug-show-ids", cfg.DebugShowIDs,
		"show session ids and user values verbatim in /debug/decisions and the dashboard (default: a keyed hash)")
	fs.BoolVar(&cfg.ClientHeaders, "client-headers", cfg.ClientHeaders,
		"send the X-Kvrouter-Replica and X-Kvrouter-Decision response headers (replica URL, cost terms) to every client; default: only to API keys with headers=on")
	fs.BoolVar(&cfg.Pprof, "pprof", cfg.Pprof,
		"serve Go's runtime profiles (CPU, heap, goroutines, trace) at /debug/pprof/ on --admin-listen, behind --admin-api-keys")

	recordFlags(fs, &cfg.Record)

	// KV-event input limits.
	fs.Var(&cfg.KVEvents.Allow, "kv-events-allow",
		"peers besides each backend's own host allowed to publish on --kv-events-bind, comma-separated: CIDRs, IPs, host names, or * for any")
	fs.Int64Var(&cfg.KVEvents.MaxMessageBytes, "kv-events-max-message-bytes", cfg.KVEvents.MaxMessageBytes,
		"largest KV-event or replay message, bytes, checked before it is read (a larger claim closes the connection)")
	fs.Int64Var(&cfg.KVEvents.MaxReplayBytes, "kv-events-max-replay-bytes", cfg.KVEvents.MaxReplayBytes, "largest replay, payload bytes")
	fs.Int64Var(&cfg.KVEvents.MaxQueueBytes, "kv-events-max-queue-bytes", cfg.KVEvents.MaxQueueBytes,
		"most KV-event bytes queued per replica; past it messages are dropped (a gap, replayed)")
	fs.IntVar(&cfg.KVEvents.MaxConns, "kv-events-max-conns", cfg.KVEvents.MaxConns, "most open connections on --kv-events-bind")
	fs.DurationVar(&cfg.KVEvents.HandshakeTimeout, "kv-events-handshake-timeout", cfg.KVEvents.HandshakeTimeout,
		"longest a KV-event connection's connect and ZMTP handshake may take")
	fs.DurationVar(&cfg.KVEvents.ReadTimeout, "kv-events-read-timeout", cfg.KVEvents.ReadTimeout,
		"longest one KV-event message may take to arrive once started")
	fs.Uint64Var(&cfg.KVEvents.MaxSeqJump, "kv-events-max-seq-jump", cfg.KVEvents.MaxSeqJump,
		"largest KV-event sequence gap taken as lost batches (a batch further ahead is not applied unless the next continues from it)")

	// Limits (issue 13): bounded memory per request and client, server timeouts, headers.
	fs.IntVar(&cfg.BodyLimits.Messages, "max-messages", cfg.BodyLimits.Messages, "most chat messages in a request (400 too_many_messages; negative: no limit)")
	fs.IntVar(&cfg.BodyLimits.Parts, "max-content-parts", cfg.BodyLimits.Parts, "most content parts over a request's messages (400 too_many_content_parts; negative: no limit)")
	fs.IntVar(&cfg.BodyLimits.Depth, "max-json-depth", cfg.BodyLimits.Depth, "deepest nesting of objects and arrays in a request body, the body counting 1 (400 nesting_too_deep)")
	fs.IntVar(&cfg.BodyLimits.Tools, "max-tools", cfg.BodyLimits.Tools, "most tools in a request (400 too_many_tools; negative: no limit)")
	fs.IntVar(&cfg.BodyLimits.Prompts, "max-prompts", cfg.BodyLimits.Prompts, "most prompts in a completions batch (400 too_many_prompts; negative: no limit)")
	fs.IntVar(&cfg.MaxSessions, "max-sessions", cfg.MaxSessions, "most sessions bound to replicas at once, least recently used dropped past it")
	fs.IntVar(&cfg.MaxHeaderBytes, "max-header-bytes", cfg.MaxHeaderBytes, "largest request header, bytes (431)")
	fs.IntVar(&cfg.MaxHeaders, "max-headers", cfg.MaxHeaders, "most header fields in a request (431 too_many_headers)")
	fs.DurationVar(&cfg.ReadHeaderTimeout, "read-header-timeout", cfg.ReadHeaderTimeout, "time a client has to send a request header (connection closed)")
	fs.DurationVar(&cfg.BodyTimeout, "body-timeout", cfg.BodyTimeout, "time a client has to send a request body after its header (408 body_timeout); responses are not bounded by it")
	fs.DurationVar(&cfg.IdleTimeout, "idle-timeout", cfg.IdleTimeout, "time an idle keep-alive connection stays open")
	fs.Var(&cfg.TrustedProxies, "trusted-proxies", "comma-separated CIDR prefixes of proxies whose X-Forwarded-* and X-Real-IP are passed on (X-Forwarded-For appended); from other peers they are dropped")

	// Upstream safety: timeouts, retry until the first token, continuation, ejection.
	fs.DurationVar(&cfg.ConnectTimeout, "upstream-connect-timeout", cfg.ConnectTimeout, "limit on connecting to a replica (0: the system's)")
	fs.DurationVar(&cfg.TTFTTimeout, "ttft-timeout", cfg.TTFTTimeout, "limit on a stream's headers and first token from a replica; past it the request is retried elsewhere (0: none)")
	fs.DurationVar(&cfg.LegTimeout, "leg-timeout", cfg.LegTimeout, "limit on a prefill leg on a prefill worker, within --ttft-timeout; past it the leg counts against the worker's health and the request is decided again without it (0: --ttft-timeout)")
	fs.DurationVar(&cfg.StreamIdleTimeout, "stream-idle-timeout", cfg.StreamIdleTimeout, "a stream whose replica sends nothing for this long is continued elsewhere or ended with an error event (0: none)")
	fs.DurationVar(&cfg.RequestTimeout, "request-timeout", cfg.RequestTimeout, "limit on a whole request, retries and continuations included (0: none)")
	fs.BoolVar(&cfg.StreamContinue, "stream-continue", cfg.StreamContinue, "continue a stream on another replica when its replica fails after the first token (false: end it with an error event)")
	fs.Float64Var(&cfg.InterconnectGBps, "interconnect-gbps", cfg.InterconnectGBps, "the replicas' link bandwidth in GB/s each way, at which --kv-transfer prices imports; 0: the preset's (50 per GPU)")
	fs.BoolVar(&cfg.KVTransfer, "kv-transfer", cfg.KVTransfer, "let the router order KV imports from a replica that holds the prompt's prefix, run as vLLM's two legs (a one-token prefill leg on the holder, whose kv_transfer_params the request then carries to its replica); only for engines with a KV connector (NixlConnector); prefill workers (--backend ...,role=prefill) take legs without it")
	fs.Int64Var(&cfg.RetryBufferBytes, "retry-buffer-bytes", cfg.RetryBufferBytes, "largest non-streaming response read whole before the client gets it, so that a failure reading it is retried (0: none)")
	fs.IntVar(&cfg.Outlier.Consecutive, "eject-consecutive", cfg.Outlier.Consecutive, "failed requests in a row that eject a replica")
	fs.DurationVar(&cfg.Outlier.EjectBase, "eject-base", cfg.Outlier.EjectBase, "first ejection's duration, doubled for each ejection in a row")
	fs.DurationVar(&cfg.Outlier.EjectMax, "eject-max", cfg.Outlier.EjectMax, "longest ejection; also the time in service that resets the doubling")
	fs.Float64Var(&cfg.Outlier.PanicThreshold, "panic-threshold", cfg.Outlier.PanicThreshold,
		"fraction of replicas in service below which those ejected by failed probes alone, whose requests have not failed since, get traffic again (panic mode, Envoy's healthy_panic_threshold; negative: never)")
	fs.StringVar(&cfg.Peers.URL, "redis", cfg.Peers.URL, "Redis URL through which several routers share sessions, in-flight load and routed blocks, redis://[user:password@]host:port[/db], or rediss:// for TLS (empty: this router decides alone)")
	fs.DurationVar(&cfg.Peers.Interval, "sync-interval", cfg.Peers.Interval, "how often the shared state is published to and read from --redis (0: 50ms)")
	fs.DurationVar(&cfg.Peers.TTL, "shared-ttl", cfg.Peers.TTL, "how long a router's load counts after its last publication to --redis (0: 20 sync intervals, at least 1s)")
	fs.StringVar(&cfg.Peers.Router, "router-id", cfg.Peers.Router, "this router's name among its peers on --redis (empty: random)")
	fs.DurationVar(&cfg.Peers.ReadTimeout, "shared-read-timeout", cfg.Peers.ReadTimeout,
		"longest a request with a session waits for --redis to read its binding before deciding, and for its binding's write before its answer ends (the write goes on in the background) (0: 5ms)")
	fs.StringVar(&cfg.Peers.CAFile, "redis-ca", cfg.Peers.CAFile, "PEM certificate authorities a rediss:// --redis server is verified against (empty: the system's)")
	fs.StringVar(&cfg.Peers.KeyFile, "redis-key-file", cfg.Peers.KeyFile,
		"file holding the secret (at least 16 bytes, e.g. openssl rand -hex 32) with which every router on --redis signs what it writes there and checks what it reads; values that fail are ignored (empty: shared state unauthenticated, warned at start); one secret a line: the first signs, any checks (to rotate)")
	return bl
}

// sloFlags binds the SLO flags: the fleet's default targets, the client
// classes' and what happens to a request no replica is predicted to meet
// its SLO on.
func sloFlags(fs *flag.FlagSet, s *proxy.SLOs) {
	fs.DurationVar(&s.TTFT, "slo-ttft", s.TTFT, "the fleet's default SLO bound on time to first token, for requests whose API key has no class and that send no "+proxy.HeaderSLOTTFT+" header (0: none)")
	fs.DurationVar(&s.ITL, "slo-itl", s.ITL, "the fleet's default SLO bound on the mean time between output tokens (header "+proxy.HeaderSLOTPOT+" per request; 0: none)")
	fs.Var(&s.Classes, "slo-classes", "client classes' SLOs, NAME=TTFT/ITL comma-separated (e.g. interactive=500ms/50ms,batch=30s/0; 0: no bound), which an API key takes with class=NAME")
	fs.StringVar(&s.Admission, "slo-admission", s.Admission, "what happens to a request no replica is predicted to meet the SLO of (predicted miss >= "+strconv.FormatFloat(fleet.MissThreshold, 'g', -1, 64)+"): route (anyway), queue (in the router's queue until a replica is predicted to meet it; 429 once its TTFT bound passes) or reject (429 slo_unattainable with Retry-After)")
}

// pathList is the --pass-through flag: comma-separated paths, replacing
// the list it had.
type pathList struct{ list *[]string }

func (p *pathList) String() string {
	if p.list == nil {
		return ""
	}
	return strings.Join(*p.list, ",")
}

// Set replaces the list; an empty value empties it.
func (p *pathList) Set(s string) error {
	*p.list = []string{}
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			*p.list = append(*p.list, f)
		}
	}
	return nil
}

// envName is the environment variable that sets flag name.
func envName(name string) string {
	return "KVROUTER_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

var serveHelp = help{
	synopsis: "kvrouter serve --backend URL [--backend URL ...] [flags]",
	about: "Runs the router: an OpenAI-compatible proxy (/v1/chat/completions,\n" +
		"/v1/completions, /v1/models) in front of vLLM, SGLang or any OpenAI-compatible\n" +
		"replicas, sending each request where it will be served soonest given what each\n" +
		"replica caches, its queue and its KV memory. The dashboard, /metrics and\n" +
		"/debug/decisions are on --admin-listen. SIGTERM drains; SIGINT too.\n\n" +
		"Every flag can also be set as KVROUTER_<FLAG> (e.g. KVROUTER_SCRAPE_INTERVAL=250ms;\n" +
		"KVROUTER_BACKEND takes space-separated backends) or as a key of the --config YAML\n" +
		"file, where backends may also be a list of mappings (backend:\n" +
		"  - url: http://a:8000\n" +
		"    kv: tcp://a:5557\n" +
		"    models: [m]).\n" +
		"Precedence: flags > environment > file > defaults.",
	examples: []string{
		"kvrouter serve --backend http://10.0.0.1:8000 --backend http://10.0.0.2:8000",
		"kvrouter serve --listen 0.0.0.0:8000 --policy kv-aware --config kvrouter.yaml",
		"kvrouter serve --tokenizer remote --backend http://10.0.0.5:8000,kv=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558",
	},
}

// loadServeConfig builds the serve configuration with precedence
// flags > KVROUTER_* environment > config file > defaults. getenv is
// os.Getenv outside tests.
func loadServeConfig(args []string, getenv func(string) string, stderr io.Writer) (proxy.Config, error) {
	return loadConfig("serve", serveHelp, args, getenv, stderr, nil)
}

// ownFlags are a subcommand's flags beside serve's (epp's), with the same
// environment variables and config-file keys.
type ownFlags interface {
	// bind binds the flags on fs, each set to its default.
	bind(fs *flag.FlagSet)
	// apply checks them together once set and applies them to cfg.
	apply(cfg *proxy.Config) error
}

// loadConfig is loadServeConfig for the subcommand cmd (serve, or epp,
// which takes serve's flags and its own, own), whose -h prints h.
func loadConfig(cmd string, h help, args []string, getenv func(string) string, stderr io.Writer, own ownFlags) (proxy.Config, error) {
	// First pass: find --config and which flags were given.
	scratch := proxy.DefaultConfig()
	var path string
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	serveFlags(fs, &scratch, &path)
	var ownNames []string
	if own != nil {
		ownFS := flag.NewFlagSet(cmd, flag.ContinueOnError)
		own.bind(ownFS)
		ownFS.VisitAll(func(f *flag.Flag) { ownNames = append(ownNames, f.Name) })
		own.bind(fs)
		h.own = ownNames
	}
	if err := parseFlags(fs, args, h, stderr); err != nil {
		return proxy.Config{}, err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if path == "" {
		path = getenv(envName("config"))
	}

	cfg := proxy.DefaultConfig()
	var fromFile map[string]string
	if path != "" {
		var err error
		if fromFile, err = readConfigFile(path, &cfg, ownNames); err != nil {
			return proxy.Config{}, err
		}
	}
	// Second pass on the real config: the file's own keys, the
	// environment, then flags.
	fs2 := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs2.SetOutput(io.Discard)
	var ignored string
	bl := serveFlags(fs2, &cfg, &ignored)
	if own != nil {
		own.bind(fs2)
	}
	for name, v := range fromFile {
		if err := fs2.Set(name, v); err != nil {
			return proxy.Config{}, fmt.Errorf("config %s: %s: %q: %w", path, name, v, err)
		}
	}
	var err error
	fs2.VisitAll(func(f *flag.Flag) {
		if err != nil || f.Name == "config" || given[f.Name] {
			return
		}
		if v, ok := lookup(getenv, envName(f.Name)); ok {
			if e := fs2.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", envName(f.Name), v, e)
			}
		}
	})
	if err != nil {
		return proxy.Config{}, err
	}
	bl.touched = false
	if err := fs2.Parse(args); err != nil {
		return proxy.Config{}, err
	}
	if own != nil {
		if err := own.apply(&cfg); err != nil {
			return proxy.Config{}, err
		}
	}
	if err := cfg.Validate(); err != nil {
		return proxy.Config{}, fmt.Errorf("invalid configuration:\n%w", err)
	}
	return cfg, nil
}

func lookup(getenv func(string) string, name string) (string, bool) {
	v := getenv(name)
	return v, v != ""
}

// osGetenv is the getenv of a real run.
func osGetenv(name string) string { return os.Getenv(name) }

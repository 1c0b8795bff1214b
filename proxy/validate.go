package proxy

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
)

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
	if err := c.Record.Validate(); err != nil {
		errs = append(errs, err)
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
	if c.ScrapeIdleInterval < 0 {
		errs = append(errs, fmt.Errorf("scrape-idle-interval: must not be negative, got %s", c.ScrapeIdleInterval))
	}
	if c.ModelsInterval < 0 {
		errs = append(errs, fmt.Errorf("models-interval: must not be negative, got %s", c.ModelsInterval))
	}
	if err := c.Sessions.Validate(); err != nil {
		errs = append(errs, err)
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
	if err := c.Admission.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.SLO.Validate(c.Admission); err != nil {
		errs = append(errs, err)
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
		{"leg-timeout", int64(c.LegTimeout)},
		{"stream-idle-timeout", int64(c.StreamIdleTimeout)},
		{"request-timeout", int64(c.RequestTimeout)},
		{"retry-buffer-bytes", c.RetryBufferBytes},
	} {
		if p.v < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative, got %d", p.name, p.v))
		}
	}
	if err := c.Outlier.Validate(); err != nil {
		errs = append(errs, err)
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
		if b.Role == route.RolePrefill && !c.KVTransfer {
			errs = append(errs, fmt.Errorf("backend %q: role=prefill needs --kv-transfer (kv-transfer: true): the engines hand prompts' KV over with a KV connector, whose links the router prices", b.URL))
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

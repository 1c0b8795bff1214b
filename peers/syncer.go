package peers

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/kvrouter/kvrouter/fleet"
)

// Defaults of Config's zero fields.
const (
	// DefaultInterval is how often a router publishes and reads.
	DefaultInterval = 50 * time.Millisecond
	// DefaultPrefix is the Redis key prefix.
	DefaultPrefix = "kvrouter"
	// DefaultStreamLen is about how many rounds' deltas the stream keeps.
	DefaultStreamLen = 10_000
	// MaxShareBytes is the largest share a Syncer decodes; a larger value
	// in Redis is skipped (and counted as a decode error).
	MaxShareBytes = 16 << 20
	// MaxRouters is the most routers a Syncer reads.
	MaxRouters = 1024
	// readCount is the most stream entries one round reads.
	readCount = 256
)

// Settings are what an operator sets of Config (kvrouter serve's flags,
// which are the YAML keys).
type Settings struct {
	// URL is the Redis URL (redis://[user:pass@]host:port[/db], or
	// rediss:// for TLS); kvrouter runs no syncer without one.
	URL string `yaml:"redis"`
	// Interval is the time between rounds; zero means DefaultInterval.
	Interval time.Duration `yaml:"sync-interval"`
	// TTL is how long a router's load is counted after its last round;
	// zero means 20 × Interval, at least 1 s.
	TTL time.Duration `yaml:"shared-ttl"`
	// Router names this router among its peers; empty means a random id.
	Router string `yaml:"router-id"`
	// ReadTimeout bounds a request's read of its session's binding before
	// the decision, and its wait for the binding's write before its answer
	// ends (sessions.go); zero means DefaultReadTimeout.
	ReadTimeout time.Duration `yaml:"shared-read-timeout"`
	// KeyFile names a file holding the secret every router of the fleet
	// seals its shared values with (seal.go); empty means values are
	// neither sealed nor checked (a warning at start).
	KeyFile string `yaml:"redis-key-file"`
	// CAFile names a PEM file of the certificate authorities a rediss://
	// server is verified against; empty means the system's.
	CAFile string `yaml:"redis-ca"`
}

// Config describes a Syncer.
type Config struct {
	// Settings are the Redis server, the router's name and the timing.
	Settings
	// Timeout bounds each round's Redis commands; zero means 2 × Interval,
	// at least 250 ms, at most TTL/2 (a slow round only delays the next:
	// the request path never waits for one).
	Timeout time.Duration
	// Prefix starts every key; zero means DefaultPrefix.
	Prefix string
	// StreamLen is about how many rounds' deltas the stream keeps; zero
	// means DefaultStreamLen.
	StreamLen int64
	// Logger receives the transitions to and from degraded mode; nil
	// means discard.
	Logger *slog.Logger
	// Registry receives the kvrouter_shared_state_* metrics; nil means
	// none.
	Registry prometheus.Registerer
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// ApplyMembers makes the router's backends the shared membership
	// (members.go), from the Syncer's goroutine; nil means the membership
	// is not followed. An error makes the next round apply it again.
	ApplyMembers func([]Member) error
}

// Syncer shares a fleet's view through Redis: Run does every round.
type Syncer struct {
	cfg    Config
	f      *fleet.Fleet
	client *redis.Client
	fast   *redis.Client // the request path's: session reads and writes
	log    *slog.Logger
	m      *metrics
	sm     *sessionMetrics
	keys   keys
	seal   sealer
	writes chan sessionWrite // bindings for writeSessions

	up      atomic.Bool
	peers   atomic.Int64
	rounds  atomic.Int64 // successful rounds
	pending fleet.Share  // deltas not yet published (owned by Run)
	lastID  string       // last stream entry read (owned by Run)
	lastOK  time.Time    // last successful round (owned by Run)
	merged  bool         // the last Merge had peers' shares
	applied string       // the members version last applied (owned by Run)
	retry   bool         // the last apply failed: apply again (owned by Run)

	mmu    sync.Mutex        // guards unsent
	unsent map[string]Member // membership changes not yet written, by URL
}

// keys are the Redis keys of one prefix.
type keys struct{ prefix, routers, events string }

func keysOf(prefix string) keys {
	return keys{prefix: prefix, routers: prefix + ":routers", events: prefix + ":events"}
}

func (k keys) load(router string) string { return k.prefix + ":load:" + router }

// New returns a Syncer of f for cfg; it tells f to keep its deltas
// (fleet.Fleet.SharePeers). Nothing connects until Run.
func New(cfg Config, f *fleet.Fleet) (*Syncer, error) {
	opts, err := redis.ParseURL(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("peers: redis url: %w", err)
	}
	if cfg.Interval < 0 || cfg.TTL < 0 || cfg.Timeout < 0 || cfg.StreamLen < 0 || cfg.ReadTimeout < 0 {
		return nil, errors.New("peers: negative Interval, TTL, Timeout, StreamLen or ReadTimeout")
	}
	if cfg.ReadTimeout == 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.TTL == 0 {
		cfg.TTL = max(20*cfg.Interval, time.Second)
	}
	if cfg.TTL < 2*cfg.Interval {
		return nil, fmt.Errorf("peers: TTL %v shorter than two intervals (%v)", cfg.TTL, 2*cfg.Interval)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = min(max(2*cfg.Interval, 250*time.Millisecond), cfg.TTL/2)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.StreamLen == 0 {
		cfg.StreamLen = DefaultStreamLen
	}
	if cfg.Router == "" {
		var b [6]byte
		rand.Read(b[:])
		cfg.Router = hex.EncodeToString(b[:])
	}
	if strings.ContainsAny(cfg.Router, " \t\r\n") || len(cfg.Router) > 128 {
		return nil, fmt.Errorf("peers: router id %q: want up to 128 bytes without spaces", cfg.Router)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := trustCA(opts, cfg.CAFile); err != nil {
		return nil, err
	}
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = cfg.Timeout, cfg.Timeout, cfg.Timeout
	opts.MaxRetries = -1 // the next round is the retry
	opts.PoolSize, opts.MinIdleConns = 2, 0
	opts.ContextTimeoutEnabled = true
	opts.DisableIdentity = true
	opts.Protocol = 2
	opts.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	s := &Syncer{cfg: cfg, f: f, log: cfg.Logger, keys: keysOf(cfg.Prefix), lastID: "0",
		writes: make(chan sessionWrite, maxQueuedWrites)}
	if cfg.KeyFile != "" {
		if s.seal.keys, err = readKeyFile(cfg.KeyFile); err != nil {
			return nil, fmt.Errorf("peers: %w", err)
		}
	} else {
		s.log.Warn("shared state is unauthenticated: whoever can write Redis can add backends to every router; set --redis-key-file", "redis", opts.Addr)
	}
	if s.m, err = newMetrics(cfg.Registry, s); err != nil {
		return nil, err
	}
	if s.sm, err = newSessionMetrics(cfg.Registry); err != nil {
		return nil, err
	}
	s.client = redis.NewClient(opts)
	fast := *opts
	fast.PoolSize, fast.MinIdleConns = 64, 2
	s.fast = redis.NewClient(&fast)
	f.SharePeers(0)
	return s, nil
}

// trustCA makes opts verify its TLS server against the authorities in
// caFile (none: the system's).
func trustCA(opts *redis.Options, caFile string) error {
	if caFile == "" {
		return nil
	}
	if opts.TLSConfig == nil {
		return errors.New("peers: redis CA file given, but the Redis URL is not rediss:// (TLS)")
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return fmt.Errorf("peers: redis CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("peers: redis CA file %s: no PEM certificate", caFile)
	}
	opts.TLSConfig.RootCAs = pool
	return nil
}

// Router returns the router's id.
func (s *Syncer) Router() string { return s.cfg.Router }

// Up reports whether the last round reached Redis.
func (s *Syncer) Up() bool { return s.up.Load() }

// Rounds returns the rounds that reached Redis so far: what a router
// decided before round k of its own was published is in every peer's view
// once each has completed a round after that.
func (s *Syncer) Rounds() int64 { return s.rounds.Load() }

// Peers returns the other routers seen in the last successful round.
func (s *Syncer) Peers() int { return int(s.peers.Load()) }

// Run runs a round every Interval until ctx is done, then removes this
// router's load from Redis (best effort: its TTL does it otherwise) and
// closes the client. It returns nil.
func (s *Syncer) Run(ctx context.Context) error {
	defer s.client.Close()
	defer s.fast.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.writeSessions(ctx) })
	s.lastOK = s.cfg.Now()
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	for {
		s.round(ctx)
		select {
		case <-ctx.Done():
			s.leave()
			return nil
		case <-t.C:
		}
	}
}

// leave deletes this router's load key and set entry.
func (s *Syncer) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Timeout)
	defer cancel()
	pipe := s.client.Pipeline()
	pipe.Del(ctx, s.keys.load(s.cfg.Router))
	pipe.SRem(ctx, s.keys.routers, s.cfg.Router)
	pipe.Exec(ctx)
}

// round publishes the fleet's share and merges the others'.
func (s *Syncer) round(ctx context.Context) {
	now := s.cfg.Now()
	s.hold(s.f.Export(now))
	rctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	start := time.Now()
	shares, version, err := s.exchange(rctx, now)
	if err == nil {
		err = s.flushMembers(rctx)
	}
	if err == nil {
		err = s.syncMembers(rctx, version)
	}
	s.m.round.Observe(time.Since(start).Seconds())
	if err != nil {
		s.failed(ctx, now, err)
		return
	}
	s.lastOK = now
	s.f.Merge(now, shares)
	s.merged = len(shares) > 0
	s.rounds.Add(1)
	if !s.up.Swap(true) {
		s.log.Info("shared state up: routing on the routers' shared view", "redis", s.client.Options().Addr, "router", s.cfg.Router)
	}
}

// failed handles a round that did not reach Redis: degraded mode.
func (s *Syncer) failed(ctx context.Context, now time.Time, err error) {
	if ctx.Err() != nil {
		return // stopping
	}
	s.m.errors.Inc()
	if s.up.Swap(false) || s.m.errors.get() == 1 {
		s.log.Warn("shared state down: routing on this router's own view until Redis answers", "redis", s.client.Options().Addr, "err", err)
	}
	if s.merged && now.Sub(s.lastOK) > s.cfg.TTL {
		s.f.Merge(now, nil) // the peers' load is as unknown as they are gone
		s.merged = false
		s.peers.Store(0)
	}
}

// hold adds an export's deltas to those waiting to be published, keeping
// at most fleet.DefaultMaxShared of each (the oldest dropped).
func (s *Syncer) hold(x fleet.Share) {
	p := &s.pending
	p.Load, p.At = x.Load, x.At
	p.Sessions = keepLast(append(p.Sessions, x.Sessions...), fleet.DefaultMaxShared, &p.Dropped)
	p.Touches = keepLast(append(p.Touches, x.Touches...), fleet.DefaultMaxShared, &p.Dropped)
	p.Dropped += x.Dropped
	s.m.dropped.Add(float64(x.Dropped))
}

// keepLast returns the last n of s, counting those cut in dropped.
func keepLast[T any](s []T, n int, dropped *int) []T {
	if len(s) <= n {
		return s
	}
	*dropped += len(s) - n
	return append(s[:0:0], s[len(s)-n:]...)
}

// exchange runs one round's commands and returns the other routers'
// shares: their load, and the deltas the stream holds since lastID; and
// the shared membership's version.
func (s *Syncer) exchange(ctx context.Context, now time.Time) ([]fleet.Share, string, error) {
	load, err := json.Marshal(fleet.Share{Router: s.cfg.Router, At: now, Load: s.pending.Load})
	if err != nil {
		return nil, "", err
	}
	deltas := len(s.pending.Sessions)+len(s.pending.Touches) > 0
	pipe := s.client.Pipeline()
	lk := s.keys.load(s.cfg.Router)
	pipe.Set(ctx, lk, s.seal.seal(lk, s.cfg.Router, string(load)), s.cfg.TTL)
	pipe.SAdd(ctx, s.keys.routers, s.cfg.Router)
	var xadd *redis.StringCmd
	if deltas {
		d, err := json.Marshal(fleet.Share{At: now, Sessions: s.pending.Sessions, Touches: s.pending.Touches, Dropped: s.pending.Dropped})
		if err != nil {
			return nil, "", err
		}
		xadd = pipe.XAdd(ctx, &redis.XAddArgs{Stream: s.keys.events, MaxLen: s.cfg.StreamLen, Approx: true,
			Values: []any{"r", s.cfg.Router, "d", s.seal.seal(s.keys.events, s.cfg.Router, string(d))}})
	}
	// SRANDMEMBER with a count: every member when there are at most
	// MaxRouters, else MaxRouters of them, never an unbounded reply.
	members := pipe.SRandMemberN(ctx, s.keys.routers, MaxRouters)
	xr := pipe.XRead(ctx, &redis.XReadArgs{Streams: []string{s.keys.events, s.lastID}, Count: readCount, Block: -1})
	version := pipe.Get(ctx, s.keys.membersVersion())
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, "", err
	}
	if xadd != nil {
		if err := xadd.Err(); err != nil {
			return nil, "", err
		}
		s.pending.Sessions, s.pending.Touches, s.pending.Dropped = nil, nil, 0
	}
	shares := s.readStream(xr)
	peersLoad, err := s.readLoads(ctx, members.Val())
	if err != nil {
		return nil, "", err
	}
	return append(peersLoad, shares...), version.Val(), nil
}

// readStream decodes the stream entries of other routers, moving lastID
// past them.
func (s *Syncer) readStream(xr *redis.XStreamSliceCmd) []fleet.Share {
	var out []fleet.Share
	for _, st := range xr.Val() {
		for _, msg := range st.Messages {
			s.lastID = msg.ID
			if r, _ := msg.Values["r"].(string); r == s.cfg.Router {
				continue
			}
			d, _ := msg.Values["d"].(string)
			var sh fleet.Share
			if !s.openShare(KindEvent, s.keys.events, d, &sh) {
				continue
			}
			out = append(out, sh)
		}
	}
	return out
}

// openShare checks and decodes the share v read under key k, counting a
// value too large, unsealed (kind) or malformed; it reports whether sh
// holds it.
func (s *Syncer) openShare(kind, k, v string, sh *fleet.Share) bool {
	if len(v) > MaxShareBytes {
		s.m.decodeErrors.Inc()
		return false
	}
	payload, _, ok := s.seal.open(k, v)
	if !ok {
		s.m.reject(kind)
		return false
	}
	if err := decode(payload, sh); err != nil {
		s.m.decodeErrors.Inc()
		return false
	}
	return true
}

// readLoads reads the load of every router in members but this one, and
// forgets those whose key expired.
func (s *Syncer) readLoads(ctx context.Context, members []string) ([]fleet.Share, error) {
	others := make([]string, 0, len(members))
	for _, m := range members {
		if m != s.cfg.Router && len(others) < MaxRouters {
			others = append(others, m)
		}
	}
	if len(others) == 0 {
		s.peers.Store(0)
		return nil, nil
	}
	// GETRANGE, not MGET: at most MaxShareBytes+1 bytes of each key are
	// read ("" for a key that expired).
	ks := make([]string, len(others))
	cmds := make([]*redis.StringCmd, len(others))
	pipe := s.client.Pipeline()
	for i, m := range others {
		ks[i] = s.keys.load(m)
		cmds[i] = pipe.GetRange(ctx, ks[i], 0, MaxShareBytes)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	var out []fleet.Share
	var gone []any
	for i, c := range cmds {
		str := c.Val()
		if str == "" {
			gone = append(gone, others[i])
			continue
		}
		var sh fleet.Share
		if !s.openShare(KindLoad, ks[i], str, &sh) {
			continue
		}
		sh.Sessions, sh.Touches = nil, nil // loads only: deltas come by the stream
		out = append(out, sh)
	}
	s.peers.Store(int64(len(out)))
	if len(gone) > 0 {
		s.client.SRem(ctx, s.keys.routers, gone...) // best effort: the next round retries
	}
	return out, nil
}

// decode parses one share, refusing one larger than MaxShareBytes.
func decode(data string, sh *fleet.Share) error {
	if len(data) > MaxShareBytes {
		return fmt.Errorf("share of %d bytes > %d", len(data), MaxShareBytes)
	}
	return json.Unmarshal([]byte(data), sh)
}

package kvevents

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/residency"
)

// Replica is one engine whose events a Subscriber follows.
type Replica struct {
	// ID is the replica's id in the residency index.
	ID int
	// Model is the served model name folded into the chain roots
	// (prefix.Root(Model, lora)); it must be the name the router hashes
	// requests under. Empty means the model of the topic
	// ("kv@<host>:<port>@<model>").
	Model string
	// Endpoint is the engine's PUB endpoint to connect to, e.g.
	// "tcp://10.0.0.5:5557" (backend option kv=). Empty means the engine
	// dials in to Config.Bind and is recognised by Addr.
	Endpoint string
	// Replay is the engine's ROUTER replay endpoint, e.g.
	// "tcp://10.0.0.5:5558" (backend option replay=); empty means gaps
	// cannot be replayed and reset the replica.
	Replay string
	// Addr is "<host>:<port>" of the topic "kv@<host>:<port>@<model>" the
	// engine publishes under, for bind mode (usually the backend's HTTP
	// host and port).
	Addr string
}

// Config configures a Subscriber.
type Config struct {
	// Index receives the blocks in GPU memory. Required. Its per-replica
	// capacity must be at least the engine's number of GPU blocks, or the
	// index evicts blocks the engine still holds. Blocks held only on other
	// media (CPU, disk) go to Offloaded.
	Index *residency.Index
	// Offloaded, if not nil, receives the blocks held on other media (a
	// CPU tier), whether or not they are also in GPU memory; nil means
	// they are only counted (Status.Offloaded).
	Offloaded *residency.Index
	// Replicas are the engines to follow; IDs must be distinct.
	Replicas []Replica
	// Bind, if not empty, is the endpoint of one SUB socket that engines
	// dial into (e.g. "tcp://0.0.0.0:5557"); its messages go to the
	// replica whose Addr matches the topic.
	Bind string
	// Now is the index clock (the time passed to residency Store); nil
	// means the time since Start.
	Now func() time.Duration
	// StaleAfter is how long events may be missing after the router
	// expected some (Expect) before the replica is stale. An idle engine
	// publishes nothing, so silence alone is never stale. Zero means 30 s.
	StaleAfter time.Duration
	// ReplayTimeout bounds one replay exchange. Zero means 5 s.
	ReplayTimeout time.Duration
	// MinBackoff and MaxBackoff bound the wait between connection
	// attempts (doubling). Zero means 100 ms and 5 s.
	MinBackoff, MaxBackoff time.Duration
	// QueueLen is the per-replica queue of received messages. In bind
	// mode a full queue drops messages (seen as a gap, then replayed).
	// Zero means 4096.
	QueueLen int
	// Logger receives connection and reset notes; nil means
	// slog.Default().
	Logger *slog.Logger

	// Limits bound what the sockets may cost; zero values mean
	// DefaultLimits'.
	Limits
}

// Subscriber follows the KV events of a set of replicas into the index:
// one goroutine per replica applies its batches in order; in connect mode
// one more per replica owns its SUB connection; in bind mode one goroutine
// accepts engines' connections and one per connection reads it and
// dispatches by topic. Every connection is a zmtp.Conn: sizes are bounded
// before allocation, handshakes and messages by deadlines, and bind-mode
// peers by their address (Config.Allow).
type Subscriber struct {
	cfg       Config
	reps      []*ingester
	byID      map[int]*ingester
	byAddr    map[string]*ingester // bind-mode replicas by Addr
	byAnyAddr map[string]*ingester // every replica with an Addr
	hosts     map[netip.Addr]bool  // every bind-mode replica's host addresses
	peers     peers                // Config.Allow
	rej       rejects
	bind      *listener // nil without Config.Bind
	start     time.Time
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closed    atomic.Bool
}

// Start validates cfg, binds Config.Bind if set, and starts following
// every replica until Close.
func Start(cfg Config) (*Subscriber, error) {
	s := &Subscriber{byID: map[int]*ingester{}, byAddr: map[string]*ingester{}, byAnyAddr: map[string]*ingester{},
		hosts: map[netip.Addr]bool{}, start: time.Now()}
	if err := s.configure(cfg); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	if s.cfg.Bind != "" {
		l, err := s.listen(s.cfg.Bind)
		if err != nil {
			cancel()
			return nil, err
		}
		s.bind = l
		s.wg.Go(func() { l.run(ctx) })
	}
	for _, g := range s.reps {
		gctx, gcancel := context.WithCancel(ctx)
		g.cancel = gcancel
		s.wg.Go(func() { g.run(gctx) })
		if g.rep.Endpoint != "" {
			s.wg.Go(func() { s.connect(gctx, g) })
		}
	}
	return s, nil
}

func (s *Subscriber) configure(cfg Config) error {
	if cfg.Index == nil {
		return errors.New("kvevents: no index")
	}
	if cfg.Now == nil {
		cfg.Now = func() time.Duration { return time.Since(s.start) }
	}
	cfg.StaleAfter = cmp0(cfg.StaleAfter, 30*time.Second)
	cfg.ReplayTimeout = cmp0(cfg.ReplayTimeout, 5*time.Second)
	cfg.MinBackoff = cmp0(cfg.MinBackoff, 100*time.Millisecond)
	cfg.MaxBackoff = max(cmp0(cfg.MaxBackoff, 5*time.Second), cfg.MinBackoff)
	if cfg.QueueLen <= 0 {
		cfg.QueueLen = 4096
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cfg.Limits = cfg.Limits.resolved()
	s.cfg = cfg
	p, err := parsePeers(cfg.Allow)
	if err != nil {
		return err
	}
	s.peers = p
	for _, r := range cfg.Replicas {
		if _, dup := s.byID[r.ID]; dup {
			return fmt.Errorf("kvevents: replica %d listed twice", r.ID)
		}
		if r.Endpoint == "" && (cfg.Bind == "" || r.Addr == "") {
			return fmt.Errorf("kvevents: replica %d has no endpoint and no bind address to be matched on", r.ID)
		}
		g := newIngester(r, &s.cfg, &s.rej)
		s.reps = append(s.reps, g)
		s.byID[r.ID] = g
		if r.Addr != "" {
			s.byAnyAddr[r.Addr] = g
		}
		if r.Endpoint == "" {
			s.byAddr[r.Addr] = g
			s.resolveHost(g)
		}
	}
	return nil
}

// resolveHost learns the addresses bind-mode replica g's engine may
// publish from: its Addr's host.
func (s *Subscriber) resolveHost(g *ingester) {
	addrs, err := hostAddrs(g.rep.Addr)
	if err != nil || len(addrs) == 0 {
		g.log.Warn("kv events: replica host does not resolve; only --kv-events-allow peers can publish for it", "addr", g.rep.Addr, "err", err)
	}
	g.hosts = addrs
	for _, a := range addrs {
		s.hosts[a] = true
	}
}

// hostKnown reports whether ip is some bind-mode replica's host.
func (s *Subscriber) hostKnown(ip netip.Addr) bool { return s.hosts[ip] }

// Close stops every goroutine and closes the sockets. The index keeps what
// was applied.
func (s *Subscriber) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.cancel()
	if s.bind != nil {
		s.bind.close()
	}
	s.wg.Wait()
	return nil
}

// BindAddr is an endpoint a local engine can dial to reach the bind socket
// ("tcp://127.0.0.1:PORT" for a wildcard host), or "" without one.
func (s *Subscriber) BindAddr() string {
	if s.bind == nil {
		return ""
	}
	return s.bind.addr
}

// Status returns replica r's stream health; ok is false for a replica the
// Subscriber does not follow.
func (s *Subscriber) Status(r int) (st Status, ok bool) {
	g, ok := s.byID[r]
	if !ok || g.stopped.Load() {
		return Status{}, false
	}
	return g.c.snapshot(r, time.Now(), s.cfg.StaleAfter), true
}

// Statuses returns every replica's status, ordered by replica id.
func (s *Subscriber) Statuses() []Status {
	now := time.Now()
	out := make([]Status, 0, len(s.reps))
	for _, g := range s.reps {
		out = append(out, g.c.snapshot(g.rep.ID, now, s.cfg.StaleAfter))
	}
	slices.SortFunc(out, func(a, b Status) int { return a.Replica - b.Replica })
	return out
}

// Healthy reports whether the index can be trusted for replica r
// (Status.Healthy); false for replicas not followed. The router falls
// back to approximate tracking for a replica that is not healthy.
func (s *Subscriber) Healthy(r int) bool {
	st, ok := s.Status(r)
	return ok && st.Healthy()
}

// Expect tells the Subscriber that the router sent replica r a request
// that must make its engine store at least one block (the prompt has a
// full block the index does not show on r). If no batch arrives within
// Config.StaleAfter, r is stale. Unknown replicas are ignored.
func (s *Subscriber) Expect(r int) {
	if g, ok := s.byID[r]; ok {
		g.c.expect(time.Now())
	}
}

// Unmatched returns the number of bind-mode messages whose topic matched
// no replica.
func (s *Subscriber) Unmatched() uint64 {
	if s.bind == nil {
		return 0
	}
	return s.bind.unmatched.Load()
}

// ParseTopic splits a vLLM topic "kv@<host>:<port>@<model>" into its
// address and model.
func ParseTopic(topic string) (addr, model string, ok bool) {
	rest, ok := strings.CutPrefix(topic, "kv@")
	if !ok {
		return "", "", false
	}
	addr, model, ok = strings.Cut(rest, "@")
	if !ok {
		return "", "", false
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", "", false
	}
	return addr, model, true
}

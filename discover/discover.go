// Package discover finds the router's backends in DNS: the A and AAAA
// records of a name (a Kubernetes headless Service has one per ready
// pod), or its SRV records, resolved again every interval; or in the
// Kubernetes API, watched (kube.go): the ready pods of a label selector,
// or of a Gateway API Inference Extension InferencePool. The router
// applies each new list through the same add / drain / remove path as the
// admin API and the config reload (proxy.Router.SetBackends): an address
// that vanished is drained, then removed once its streams end.
//
// Four forms of target:
//
//	dns://NAME:PORT              A/AAAA records of NAME; every address gets PORT
//	dns+srv://_SERVICE._PROTO.NAME  SRV records of the name; each target's A/AAAA
//	                             records with the record's port
//	k8s://NAMESPACE/SELECTOR?port=PORT  ready pods of the label selector
//	                             (app.kubernetes.io/name=vllm,tier in (a,b));
//	                             every pod IP gets PORT
//	inferencepool://NAMESPACE/NAME  ready pods of the InferencePool's
//	                             selector, at each of its target ports
//
// An empty NAMESPACE (k8s:///app=vllm?port=8000) is the router's own.
// for example dns://vllm-headless.llm.svc.cluster.local:8000 and
// dns+srv://_http._tcp.vllm-headless.llm.svc.cluster.local (Kubernetes
// names a Service port "http" that way). The query string may set
// scheme=https (default http) for the backends' URLs, and role=prefill,
// decode or both (default both) for their part in a disaggregated fleet
// (route.Role): every backend a target finds has its role.
package discover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/kube"
	"github.com/kvrouter/kvrouter/route"
)

// Defaults of Config's zero fields.
const (
	// DefaultInterval is how often the name is resolved again.
	DefaultInterval = 10 * time.Second
	// DefaultTimeout bounds one resolution (all its lookups).
	DefaultTimeout = 5 * time.Second
	// MaxAddrs is the most backends one resolution yields; more are an
	// error (the last good list is kept).
	MaxAddrs = 1024
)

// Target is a parsed discovery URL.
type Target struct {
	// Name is the DNS name looked up.
	Name string
	// Port is the backends' port (A/AAAA form); zero in the SRV form.
	Port int
	// SRV says the name's SRV records are looked up.
	SRV bool
	// Scheme is the backends' URL scheme, http or https.
	Scheme string
	// Role is the backends' role (route.RoleBoth: the default).
	Role route.Role
	// Kube, when not empty, says the target is in the Kubernetes API:
	// KindPods (Selector and Port) or KindPool (Pool); Name is then
	// unused.
	Kube string
	// Namespace is the pods' or the pool's namespace; empty means the
	// router's own.
	Namespace string
	// Selector is the pods' label selector in Kubernetes' syntax
	// (kube.ParseSelector), as given (KindPods).
	Selector string
	// Pool is the InferencePool's name (KindPool).
	Pool string
}

// Parse reads "dns://NAME:PORT" or "dns+srv://NAME" (optionally
// "?scheme=https", "?role=prefill", or both: "?scheme=https&role=decode").
func Parse(s string) (Target, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Target{}, fmt.Errorf("discover %q: %w", s, err)
	}
	t := Target{Scheme: "http"}
	if sc := u.Query().Get("scheme"); sc != "" {
		if sc != "http" && sc != "https" {
			return Target{}, fmt.Errorf("discover %q: scheme=%s: want http or https", s, sc)
		}
		t.Scheme = sc
	}
	if t.Role, err = route.ParseRole(u.Query().Get("role")); err != nil {
		return Target{}, fmt.Errorf("discover %q: %w", s, err)
	}
	if u.Scheme == KindPods || u.Scheme == KindPool {
		return t.parseKube(s, u)
	}
	if u.Path != "" && u.Path != "/" || u.User != nil || u.Fragment != "" {
		return Target{}, fmt.Errorf("discover %q: want dns://name:port or dns+srv://_service._proto.name, nothing else", s)
	}
	switch u.Scheme {
	case "dns":
		host, port, err := net.SplitHostPort(u.Host)
		if err != nil {
			return Target{}, fmt.Errorf("discover %q: want dns://name:port: %w", s, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 {
			return Target{}, fmt.Errorf("discover %q: port %q: want 1..65535", s, port)
		}
		t.Name, t.Port = host, p
	case "dns+srv":
		if u.Port() != "" {
			return Target{}, fmt.Errorf("discover %q: an SRV record carries its port; give none", s)
		}
		t.Name, t.SRV = u.Hostname(), true
	default:
		return Target{}, fmt.Errorf("discover %q: scheme %q: want dns, dns+srv, k8s or inferencepool", s, u.Scheme)
	}
	if t.Name == "" {
		return Target{}, fmt.Errorf("discover %q: no name", s)
	}
	return t, nil
}

// String renders t in the form Parse reads.
func (t Target) String() string {
	var q []string
	if t.Scheme != "http" {
		q = append(q, "scheme="+t.Scheme)
	}
	if t.Role != route.RoleBoth {
		q = append(q, "role="+t.Role.String())
	}
	switch t.Kube {
	case KindPods:
		q = append([]string{"port=" + strconv.Itoa(t.Port)}, q...)
	case KindPool:
		return KindPool + "://" + t.Namespace + "/" + t.Pool + queryOf(q)
	}
	query := queryOf(q)
	if t.Kube == KindPods {
		return KindPods + "://" + t.Namespace + "/" + t.Selector + query
	}
	if t.SRV {
		return "dns+srv://" + t.Name + query
	}
	return "dns://" + net.JoinHostPort(t.Name, strconv.Itoa(t.Port)) + query
}

func queryOf(q []string) string {
	if len(q) == 0 {
		return ""
	}
	return "?" + strings.Join(q, "&")
}

// Config configures a Discoverer.
type Config struct {
	// Target is what to resolve (Parse).
	Target Target
	// Interval is the time between resolutions; zero means 10 s.
	Interval time.Duration
	// Timeout bounds one resolution; zero means 5 s.
	Timeout time.Duration
	// Resolver resolves the names; nil means net.DefaultResolver. Tests
	// point one at their own DNS server (net.Resolver.Dial).
	Resolver *net.Resolver
	// OnChange receives the backends' base URLs, sorted, after the first
	// successful resolution and whenever the list changes. Required.
	OnChange func(urls []string)
	// OnResolve, when set, is called after every resolution with its
	// error (nil: it succeeded), for metrics.
	OnResolve func(err error)
	// Logger receives failed resolutions; nil means discard.
	Logger *slog.Logger
	// Kube is the Kubernetes API client of a Kubernetes target
	// (required for one; unused otherwise).
	Kube *kube.Client
}

// Discoverer resolves a Target periodically. Create it with New.
type Discoverer struct {
	cfg  Config
	last []string
	seen bool // a resolution succeeded: last is meaningful
}

// New checks cfg and returns its Discoverer.
func New(cfg Config) (*Discoverer, error) {
	if cfg.OnChange == nil {
		return nil, errors.New("discover: no OnChange")
	}
	if cfg.Target.Kube != "" {
		return newKube(cfg)
	}
	if cfg.Target.Name == "" {
		return nil, errors.New("discover: no target")
	}
	if cfg.Interval < 0 || cfg.Timeout < 0 {
		return nil, errors.New("discover: negative Interval or Timeout")
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Discoverer{cfg: cfg}, nil
}

// Run resolves the target at once and then every Interval until ctx is
// done, calling OnChange as the list changes, and returns ctx's error. A
// failed resolution (timeout, SERVFAIL, too many records) is logged and
// keeps the last list; a name that does not exist, or has no records,
// is an empty list: every backend found before is drained and removed.
func (d *Discoverer) Run(ctx context.Context) error {
	if d.cfg.Target.Kube != "" {
		return d.runKube(ctx)
	}
	t := time.NewTicker(d.cfg.Interval)
	defer t.Stop()
	for {
		d.Once(ctx)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Once resolves the target and calls OnChange if the list changed; it
// returns the resolution's error (the list is then kept).
func (d *Discoverer) Once(ctx context.Context) error {
	urls, err := d.Resolve(ctx)
	if d.cfg.OnResolve != nil && ctx.Err() == nil {
		d.cfg.OnResolve(err)
	}
	if err != nil {
		if ctx.Err() == nil {
			d.cfg.Logger.Warn("discovery failed; keeping the last backend list", "target", d.cfg.Target.String(), "backends", len(d.last), "err", err)
		}
		return err
	}
	if d.seen && slices.Equal(urls, d.last) {
		return nil
	}
	d.last, d.seen = urls, true
	d.cfg.OnChange(slices.Clone(urls))
	return nil
}

// Resolve looks the target up once and returns the backends' base URLs,
// sorted and distinct.
func (d *Discoverer) Resolve(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	t := d.cfg.Target
	var hps []netip.AddrPort
	var err error
	if t.SRV {
		hps, err = d.srv(ctx, t.Name)
	} else {
		hps, err = d.addrs(ctx, t.Name, uint16(t.Port))
	}
	if err != nil {
		return nil, err
	}
	if len(hps) > MaxAddrs {
		return nil, fmt.Errorf("discover %s: %d addresses > %d", t, len(hps), MaxAddrs)
	}
	urls := make([]string, 0, len(hps))
	for _, hp := range hps {
		urls = append(urls, t.Scheme+"://"+hp.String())
	}
	slices.Sort(urls)
	return slices.Compact(urls), nil
}

// addrs returns name's addresses with port; none when the name does not
// exist.
func (d *Discoverer) addrs(ctx context.Context, name string, port uint16) ([]netip.AddrPort, error) {
	ips, err := d.cfg.Resolver.LookupNetIP(ctx, "ip", name)
	if notFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("discover %s: %w", name, err)
	}
	out := make([]netip.AddrPort, 0, len(ips))
	for _, ip := range ips {
		out = append(out, netip.AddrPortFrom(ip.Unmap(), port))
	}
	return out, nil
}

// srv returns the addresses of name's SRV targets with their ports.
func (d *Discoverer) srv(ctx context.Context, name string) ([]netip.AddrPort, error) {
	_, recs, err := d.cfg.Resolver.LookupSRV(ctx, "", "", name)
	if notFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("discover %s: %w", name, err)
	}
	if len(recs) > MaxAddrs {
		return nil, fmt.Errorf("discover %s: %d SRV records > %d", name, len(recs), MaxAddrs)
	}
	var out []netip.AddrPort
	for _, r := range recs {
		target := strings.TrimSuffix(r.Target, ".")
		if ip, err := netip.ParseAddr(target); err == nil {
			out = append(out, netip.AddrPortFrom(ip.Unmap(), r.Port))
			continue
		}
		hps, err := d.addrs(ctx, target, r.Port)
		if err != nil {
			return nil, err
		}
		out = append(out, hps...)
	}
	return out, nil
}

// notFound reports whether err says the name has no such records.
func notFound(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de) && de.IsNotFound
}

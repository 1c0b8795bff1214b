package discover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/kvrouter/kvrouter/kube"
)

// Schemes of the Kubernetes targets.
const (
	// KindPods is k8s://NAMESPACE/SELECTOR?port=PORT.
	KindPods = "k8s"
	// KindPool is inferencepool://NAMESPACE/NAME.
	KindPool = "inferencepool"
)

// parseKube reads the Kubernetes forms of a target; t carries the query's
// scheme and role already.
func (t Target) parseKube(s string, u *url.URL) (Target, error) {
	if u.User != nil || u.Fragment != "" || u.Port() != "" {
		return Target{}, fmt.Errorf("discover %q: want %s://NAMESPACE/SELECTOR?port=PORT or %s://NAMESPACE/NAME", s, KindPods, KindPool)
	}
	t.Kube, t.Namespace = u.Scheme, u.Hostname()
	rest := strings.TrimPrefix(u.Path, "/")
	switch u.Scheme {
	case KindPods:
		p, err := strconv.Atoi(u.Query().Get("port"))
		if err != nil || p < 1 || p > 65535 {
			return Target{}, fmt.Errorf("discover %q: port=%q: want 1..65535", s, u.Query().Get("port"))
		}
		sel, err := kube.ParseSelector(rest)
		if err != nil {
			return Target{}, fmt.Errorf("discover %q: %w", s, err)
		}
		if len(sel.Reqs) == 0 {
			return Target{}, fmt.Errorf("discover %q: want a label selector such as app.kubernetes.io/name=vllm after the namespace", s)
		}
		rest = sel.String()
		t.Selector, t.Port = rest, p
	case KindPool:
		if rest == "" || strings.Contains(rest, "/") || u.Query().Has("port") {
			return Target{}, fmt.Errorf("discover %q: want %s://NAMESPACE/NAME (the pool gives the ports)", s, KindPool)
		}
		t.Pool = rest
	}
	return t, nil
}

// newKube checks a Kubernetes target's configuration.
func newKube(cfg Config) (*Discoverer, error) {
	if cfg.Kube == nil {
		return nil, errors.New("discover: a Kubernetes target needs an API client")
	}
	if cfg.Target.Namespace == "" {
		cfg.Target.Namespace = kube.Namespace()
		if cfg.Target.Namespace == "" {
			return nil, fmt.Errorf("discover %s: no namespace given and not in a cluster", cfg.Target)
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Discoverer{cfg: cfg}, nil
}

// runKube watches the target until ctx is done: each change of the ready
// endpoints becomes a new backend list. More than MaxAddrs endpoints are
// an error (the last list is kept).
func (d *Discoverer) runKube(ctx context.Context) error {
	t := d.cfg.Target
	apply := func(eps []string) {
		if len(eps) > MaxAddrs {
			err := fmt.Errorf("discover %s: %d endpoints > %d", t, len(eps), MaxAddrs)
			d.cfg.Logger.Warn("discovery failed; keeping the last backend list", "target", t.String(), "err", err)
			d.resolved(err)
			return
		}
		urls := make([]string, len(eps))
		for i, ep := range eps {
			urls[i] = t.Scheme + "://" + ep
		}
		slices.Sort(urls)
		d.resolved(nil)
		if d.seen && slices.Equal(urls, d.last) {
			return
		}
		d.last, d.seen = urls, true
		d.cfg.OnChange(slices.Clone(urls))
	}
	if t.Kube == KindPool {
		return d.cfg.Kube.FollowPool(ctx, t.Namespace, t.Pool, apply, d.cfg.Logger)
	}
	return d.cfg.Kube.FollowPods(ctx, kube.Pods{Namespace: t.Namespace, Selector: t.Selector, Ports: []int{t.Port}}, apply, d.cfg.Logger)
}

func (d *Discoverer) resolved(err error) {
	if d.cfg.OnResolve != nil {
		d.cfg.OnResolve(err)
	}
}

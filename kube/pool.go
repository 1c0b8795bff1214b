package kube

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/url"
	"slices"
	"sync"
)

// InferencePool's API group and version (Gateway API Inference
// Extension v1).
const (
	PoolGroup   = "inference.networking.k8s.io"
	PoolVersion = "v1"
)

// pool is the part of an InferencePool (GIE api/v1/inferencepool_types.go)
// the router reads: spec.selector.matchLabels and spec.targetPorts.
type pool struct {
	Spec struct {
		Selector struct {
			MatchLabels map[string]string `json:"matchLabels"`
		} `json:"selector"`
		TargetPorts []struct {
			Number int `json:"number"`
		} `json:"targetPorts"`
	} `json:"spec"`
}

// podsOf returns the pods pool o selects in its namespace; ok false when
// it selects none (no labels or no valid port).
func podsOf(o Object) (Pods, bool) {
	var p pool
	if json.Unmarshal(o.Raw, &p) != nil || len(p.Spec.Selector.MatchLabels) == 0 {
		return Pods{}, false
	}
	var ports []int
	for _, tp := range p.Spec.TargetPorts {
		if tp.Number >= 1 && tp.Number <= 65535 {
			ports = append(ports, tp.Number)
		}
	}
	if len(ports) == 0 {
		return Pods{}, false
	}
	slices.Sort(ports)
	return Pods{Namespace: o.Meta.Namespace, Selector: Labels(p.Spec.Selector.MatchLabels), Ports: slices.Compact(ports)}, true
}

// poolWatch is the Handler of an InferencePool watch: it (re)starts the
// pods watch whenever the pool's selector or ports change, and reports
// none while the pool is missing.
type poolWatch struct {
	ctx       context.Context
	c         *Client
	namespace string
	log       *slog.Logger
	onChange  func([]string)
	cur       Pods
	has       bool
	reported  bool               // set ran once
	stop      context.CancelFunc // the running pods watch's; nil: none
	wg        sync.WaitGroup
}

func (w *poolWatch) Replace(objs []Object) {
	for _, o := range objs {
		w.Apply(Added, o)
		return
	}
	w.set(Pods{}, false)
}

func (w *poolWatch) Apply(typ string, o Object) {
	if typ == Deleted {
		w.set(Pods{}, false)
		return
	}
	p, ok := podsOf(o)
	if p.Namespace == "" {
		p.Namespace = w.namespace
	}
	w.set(p, ok)
}

// set follows p's pods (ok), or none.
func (w *poolWatch) set(p Pods, ok bool) {
	if w.reported && ok == w.has && (!ok || p.Selector == w.cur.Selector && slices.Equal(p.Ports, w.cur.Ports)) {
		return
	}
	w.halt()
	w.cur, w.has, w.reported = p, ok, true
	if !ok {
		w.onChange([]string{})
		return
	}
	ctx, cancel := context.WithCancel(w.ctx)
	w.stop = cancel
	w.wg.Go(func() { _ = w.c.FollowPods(ctx, p, w.onChange, w.log) })
}

// halt stops the running pods watch and waits for it.
func (w *poolWatch) halt() {
	if w.stop != nil {
		w.stop()
		w.wg.Wait()
		w.stop = nil
	}
}

// FollowPool watches the InferencePool namespace/name and the ready pods
// its selector matches until ctx is done, calling onChange with their
// endpoints (pod IP:target port, sorted) after the first list and
// whenever they change: a pod's readiness, the pool's selector or target
// ports. While the pool does not exist there are none. It returns ctx's
// error.
func (c *Client) FollowPool(ctx context.Context, namespace, name string, onChange func(endpoints []string), log *slog.Logger) error {
	var mu sync.Mutex // serializes onChange across pods watches
	report := func(eps []string) {
		mu.Lock()
		defer mu.Unlock()
		onChange(eps)
	}
	w := &poolWatch{ctx: ctx, c: c, namespace: namespace, log: log, onChange: report}
	defer w.halt()
	col := Collection{
		Path:          "/apis/" + PoolGroup + "/" + PoolVersion + "/namespaces/" + url.PathEscape(namespace) + "/inferencepools",
		FieldSelector: "metadata.name=" + name,
	}
	return c.Follow(ctx, col, w, log)
}

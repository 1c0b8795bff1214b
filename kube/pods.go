package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// pod is the part of a core/v1 Pod the router reads.
type pod struct {
	Status struct {
		PodIP      string `json:"podIP"`
		Phase      string `json:"phase"`
		Conditions []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"conditions"`
	} `json:"status"`
}

// readyIP returns the pod's IP when it is Ready (its Ready condition
// True, running, not being deleted), else "".
func readyIP(o Object) string {
	if o.Meta.DeletionTimestamp != nil {
		return ""
	}
	var p pod
	if json.Unmarshal(o.Raw, &p) != nil || p.Status.PodIP == "" || p.Status.Phase != "Running" {
		return ""
	}
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" {
			if c.Status == "True" {
				return p.Status.PodIP
			}
			return ""
		}
	}
	return ""
}

// Pods selects pods: a namespace, a label selector and the ports each
// ready pod serves on (each pod IP:port an endpoint).
type Pods struct {
	Namespace string
	// Selector is the label selector in Kubernetes' syntax
	// ("app.kubernetes.io/name=vllm,tier in (a,b),!canary"; ParseSelector);
	// Labels builds one from a map.
	Selector string
	Ports    []int
}

// Labels renders m as an equality-based label selector, keys sorted.
func Labels(m map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}

// podSet is the Handler of a pods watch: the ready pods' IPs by name,
// reported as endpoints whenever they change.
type podSet struct {
	sel      Selector // checked again here: a pod it does not match is not an endpoint
	ports    []int
	ips      map[string]string // pod name → ready IP
	last     []string
	seen     bool
	onChange func([]string)
}

func (s *podSet) Replace(objs []Object) {
	s.ips = map[string]string{}
	for _, o := range objs {
		if ip := s.ip(o); ip != "" {
			s.ips[o.Meta.Name] = ip
		}
	}
	s.report()
}

func (s *podSet) Apply(typ string, o Object) {
	ip := s.ip(o)
	if typ == Deleted || ip == "" {
		delete(s.ips, o.Meta.Name)
	} else {
		s.ips[o.Meta.Name] = ip
	}
	s.report()
}

// ip is o's IP when the selector matches it and it is ready, else "".
func (s *podSet) ip(o Object) string {
	if !s.sel.Matches(o.Meta.Labels) {
		return ""
	}
	return readyIP(o)
}

// report calls onChange with the endpoints, sorted, when they changed.
func (s *podSet) report() {
	eps := make([]string, 0, len(s.ips)*len(s.ports))
	for _, ip := range s.ips {
		for _, p := range s.ports {
			eps = append(eps, net.JoinHostPort(ip, strconv.Itoa(p)))
		}
	}
	slices.Sort(eps)
	eps = slices.Compact(eps)
	if s.seen && slices.Equal(eps, s.last) {
		return
	}
	s.last, s.seen = eps, true
	s.onChange(slices.Clone(eps))
}

// FollowPods watches the pods p selects until ctx is done, calling
// onChange with the endpoints (ready pod IP:port, sorted) after the first
// list and whenever they change. It returns ctx's error.
func (c *Client) FollowPods(ctx context.Context, p Pods, onChange func(endpoints []string), log *slog.Logger) error {
	if p.Namespace == "" || len(p.Ports) == 0 {
		return fmt.Errorf("kube: pods need a namespace and a port")
	}
	sel, err := ParseSelector(p.Selector)
	if err != nil {
		return fmt.Errorf("kube: %w", err)
	}
	col := Collection{Path: "/api/v1/namespaces/" + url.PathEscape(p.Namespace) + "/pods", LabelSelector: p.Selector}
	return c.Follow(ctx, col, &podSet{sel: sel, ports: p.Ports, onChange: onChange}, log)
}

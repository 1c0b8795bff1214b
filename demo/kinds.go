package demo

import (
	"strings"
	"time"
)

// kindOrder lists the kinds of traffic of the demo's workload (the
// Tenant and the session-name prefix of its requests; workload.go).
var kindOrder = []string{"chat", "docs", "agent"}

// Kind is one kind of traffic's figures under one policy.
type Kind struct {
	// Name is chat, docs or agent.
	Name string
	// Requests counts its requests, completed or not.
	Requests int
	// HitRate is cached / prompt tokens of its completed requests, 0..1;
	// Prefill is their prompt tokens minus cached tokens.
	HitRate float64
	Prefill int64
	// TTFTMean is its completed requests' mean time to first token, on
	// the engines' clocks.
	TTFTMean time.Duration
	// Replicas counts the replicas that served it; Top is the share of
	// its completed requests on the busiest of them, 0..1.
	Replicas int
	Top      float64
}

// kindOf returns the kind of a request of the demo's workload from its
// session name ("chat-3" is chat), or "" for another workload's.
func kindOf(session string) string {
	name, _, ok := strings.Cut(session, "-")
	if !ok {
		return ""
	}
	for _, k := range kindOrder {
		if k == name {
			return k
		}
	}
	return ""
}

// kinds returns p's figures per kind of traffic, those present, in
// kindOrder; nil unless every request has a kind.
func kinds(p *PolicyResult) []Kind {
	type acc struct {
		Kind
		prompt, cached int64
		ttft           time.Duration
		done           int
		on             map[string]int
	}
	by := map[string]*acc{}
	for i, s := range p.Load.Samples {
		k := kindOf(s.Session)
		if k == "" {
			return nil
		}
		a := by[k]
		if a == nil {
			a = &acc{Kind: Kind{Name: k}, on: map[string]int{}}
			by[k] = a
		}
		a.Requests++
		if !s.OK() {
			continue
		}
		a.done++
		a.prompt += int64(s.PromptTokens)
		a.cached += int64(s.CachedTokens)
		a.on[s.Replica]++
		if i < len(p.samples) {
			a.ttft += p.samples[i].TTFT
		}
	}
	var out []Kind
	for _, name := range kindOrder {
		a := by[name]
		if a == nil {
			continue
		}
		k := a.Kind
		k.Prefill = a.prompt - a.cached
		k.Replicas = len(a.on)
		if a.prompt > 0 {
			k.HitRate = float64(a.cached) / float64(a.prompt)
		}
		if a.done > 0 {
			k.TTFTMean = a.ttft / time.Duration(a.done)
			top := 0
			for _, n := range a.on {
				top = max(top, n)
			}
			k.Top = float64(top) / float64(a.done)
		}
		out = append(out, k)
	}
	return out
}

// kind returns f's figures for the named kind.
func (f *Figures) kind(name string) (Kind, bool) {
	for _, k := range f.Kinds {
		if k.Name == name {
			return k, true
		}
	}
	return Kind{}, false
}

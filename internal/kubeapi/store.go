// Package kubeapi is a loopback Kubernetes API server for tests: an
// in-memory store of namespaced objects served with the API server's
// list/watch protocol, as package kube's client and kubectl speak it.
//
// What it implements, as kube-apiserver does: one cluster-wide
// resourceVersion counter stamped on every write; GET of a collection
// (list, with metadata.resourceVersion), of one object (404 Status when
// missing), POST (create; 409 AlreadyExists), PUT (update with optimistic
// concurrency: a stale metadata.resourceVersion is 409 Conflict), DELETE;
// labelSelector in Kubernetes' grammar (kube.ParseSelector) and fieldSelector
// (metadata.name, metadata.namespace); watch=true streams chunked JSON
// events, one a line (ADDED, MODIFIED, DELETED; an object that leaves a
// watch's selection is DELETED to it, one that enters it ADDED) after the resourceVersion
// given (none or "0": the current objects as ADDED first), BOOKMARK
// events when allowWatchBookmarks=true, an ERROR event with a 410 Expired
// Status when the version was compacted away, and an end at
// timeoutSeconds. Expire and DropWatches let a test force a relist and
// a reconnect. It does not authenticate, validate schemas, or know
// cluster-scoped resources.
package kubeapi

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvrouter/kvrouter/kube"
)

// key names one object: its collection (the path without the name) and
// name.
type key struct{ coll, name string }

// event is one change, kept for watches.
type event struct {
	rv   int64
	coll string
	typ  string
	obj  map[string]any
	prev map[string]any // the object before a MODIFIED; nil otherwise
}

// as returns the event as a watch with sel sees it, as kube-apiserver's
// watch cache filters: an object that leaves the selection is DELETED, one
// that enters it ADDED; ok false when the watch does not see it.
func (e event) as(sel selector) (typ string, ok bool) {
	now := sel.matches(e.obj)
	if e.typ != "MODIFIED" {
		return e.typ, now
	}
	before := sel.matches(e.prev)
	switch {
	case before && now:
		return e.typ, true
	case before:
		return "DELETED", true
	case now:
		return "ADDED", true
	}
	return "", false
}

// Server is the loopback API server. Create it with New; serve it with
// httptest.NewServer(s).
type Server struct {
	// BookmarkEvery is the period of BOOKMARK events on watches that
	// allow them; zero means 100 ms.
	BookmarkEvery time.Duration

	mu        sync.Mutex // guards everything below
	rv        int64
	objs      map[key]map[string]any
	events    []event
	compacted int64         // events at or before it are gone: watching from there is 410
	changed   chan struct{} // closed and replaced on every write
	drop      chan struct{} // closed and replaced by DropWatches
	watches   int           // watch streams open
	lists     int           // list requests served
}

// New returns an empty server.
func New() *Server {
	return &Server{rv: 1, objs: map[key]map[string]any{}, changed: make(chan struct{}), drop: make(chan struct{})}
}

// Put creates or replaces the object obj (any JSON-encodable value with
// metadata.name) in the collection at coll (e.g.
// /api/v1/namespaces/llm/pods) and returns its new resourceVersion.
func (s *Server) Put(coll string, obj any) string {
	m, err := toMap(obj)
	if err != nil {
		panic(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	name := nameOf(m)
	_, exists := s.objs[key{coll, name}]
	typ := "ADDED"
	if exists {
		typ = "MODIFIED"
	}
	return s.writeLocked(coll, name, typ, m)
}

// Delete removes coll's object name; it reports whether there was one.
func (s *Server) Delete(coll, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.objs[key{coll, name}]
	if ok { // a copy: the stored map may be on its way to a watch
		c, _ := toMap(m)
		s.writeLocked(coll, name, "DELETED", c)
	}
	return ok
}

// Get returns a copy of coll's object name, or nil.
func (s *Server) Get(coll, name string) map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.objs[key{coll, name}]
	if !ok {
		return nil
	}
	c, _ := toMap(m)
	return c
}

// Expire forgets every change so far (a watch from an older
// resourceVersion gets 410 Gone, as after etcd's compaction) and ends every open watch with a 410
// Gone ERROR event, as kube-apiserver does when etcd compacts past a
// watch: their clients must list again.
func (s *Server) Expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rv++
	s.compacted = s.rv
	s.events = nil
	close(s.changed)
	s.changed = make(chan struct{})
}

// Lists returns the number of list requests served.
func (s *Server) Lists() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lists
}

// DropWatches ends every open watch stream, as a restarting API server
// or a broken connection would.
func (s *Server) DropWatches() {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.drop)
	s.drop = make(chan struct{})
}

// Watches returns the number of open watch streams.
func (s *Server) Watches() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.watches
}

// writeLocked stamps m with the next resourceVersion, stores it (or
// deletes it) and wakes the watches.
func (s *Server) writeLocked(coll, name, typ string, m map[string]any) string {
	s.rv++
	md, _ := m["metadata"].(map[string]any)
	md["resourceVersion"] = strconv.FormatInt(s.rv, 10)
	if ns := namespaceOf(coll); ns != "" {
		md["namespace"] = ns
	}
	prev := s.objs[key{coll, name}]
	if typ == "DELETED" {
		delete(s.objs, key{coll, name})
	} else {
		s.objs[key{coll, name}] = m
	}
	if typ != "MODIFIED" {
		prev = nil
	}
	s.events = append(s.events, event{rv: s.rv, coll: coll, typ: typ, obj: m, prev: prev})
	close(s.changed)
	s.changed = make(chan struct{})
	return strconv.FormatInt(s.rv, 10)
}

// listLocked returns coll's objects that sel selects, by name.
func (s *Server) listLocked(coll string, sel selector) []map[string]any {
	var out []map[string]any
	for _, k := range slices.SortedFunc(maps.Keys(s.objs), func(a, b key) int { return strings.Compare(a.name, b.name) }) {
		if k.coll == coll && sel.matches(s.objs[k]) {
			out = append(out, s.objs[k])
		}
	}
	return out
}

func toMap(obj any) (map[string]any, error) {
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	if _, ok := m["metadata"].(map[string]any); !ok {
		return nil, fmt.Errorf("kubeapi: object without metadata")
	}
	return m, nil
}

func nameOf(m map[string]any) string {
	md, _ := m["metadata"].(map[string]any)
	n, _ := md["name"].(string)
	return n
}

func rvOf(m map[string]any) string {
	md, _ := m["metadata"].(map[string]any)
	v, _ := md["resourceVersion"].(string)
	return v
}

// namespaceOf returns the namespace a collection path names.
func namespaceOf(coll string) string {
	parts := strings.Split(coll, "/")
	for i, p := range parts {
		if p == "namespaces" && i+1 < len(parts) {
			return parts[i+1]
		}
	}
	return ""
}

// selector is a parsed labelSelector (Kubernetes' whole grammar, as
// kube.ParseSelector reads it) and fieldSelector (equality only).
type selector struct {
	labels kube.Selector
	fields []req
}

type req struct {
	k, v string
	not  bool
}

func parseReqs(s string) ([]req, error) {
	var out []req
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		r := req{}
		var ok bool
		if r.k, r.v, ok = strings.Cut(part, "!="); ok {
			r.not = true
		} else if r.k, r.v, ok = strings.Cut(part, "=="); !ok {
			if r.k, r.v, ok = strings.Cut(part, "="); !ok {
				return nil, fmt.Errorf("selector %q: only equality-based requirements", part)
			}
		}
		out = append(out, r)
	}
	return out, nil
}

func (sel selector) matches(m map[string]any) bool {
	md, _ := m["metadata"].(map[string]any)
	labels := map[string]string{}
	raw, _ := md["labels"].(map[string]any)
	for k, v := range raw {
		labels[k], _ = v.(string)
	}
	if !sel.labels.Matches(labels) {
		return false
	}
	for _, r := range sel.fields {
		var v string
		switch r.k {
		case "metadata.name":
			v, _ = md["name"].(string)
		case "metadata.namespace":
			v, _ = md["namespace"].(string)
		}
		if (v == r.v) == r.not {
			return false
		}
	}
	return true
}

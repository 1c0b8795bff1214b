package kubeapi

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/kube"
)

// maxBodyBytes bounds a request body.
const maxBodyBytes = 1 << 20

// ServeHTTP serves the API under /api/v1/namespaces/NS/RESOURCE[/NAME]
// and /apis/GROUP/VERSION/namespaces/NS/RESOURCE[/NAME].
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	coll, name, ok := split(r.URL.Path)
	if !ok {
		writeStatus(w, http.StatusNotFound, "NotFound", "no such path "+r.URL.Path)
		return
	}
	q := r.URL.Query()
	switch {
	case r.Method == http.MethodGet && name == "" && (q.Get("watch") == "true" || q.Get("watch") == "1"):
		s.serveWatch(w, r, coll)
	case r.Method == http.MethodGet && name == "":
		s.serveList(w, r, coll)
	case r.Method == http.MethodGet:
		s.serveGet(w, coll, name)
	case r.Method == http.MethodPost && name == "":
		s.serveWrite(w, r, coll, "", true)
	case r.Method == http.MethodPut && name != "":
		s.serveWrite(w, r, coll, name, false)
	case r.Method == http.MethodDelete && name != "":
		if !s.Delete(coll, name) {
			writeStatus(w, http.StatusNotFound, "NotFound", name+" not found")
			return
		}
		writeStatus(w, http.StatusOK, "", "deleted")
	default:
		writeStatus(w, http.StatusMethodNotAllowed, "MethodNotAllowed", r.Method+" "+r.URL.Path)
	}
}

// split cuts a path into its collection and object name ("" for the
// collection itself).
func split(p string) (coll, name string, ok bool) {
	parts := strings.Split(strings.Trim(p, "/"), "/")
	var n int // parts before "namespaces"
	switch {
	case len(parts) >= 2 && parts[0] == "api" && parts[1] == "v1":
		n = 2
	case len(parts) >= 3 && parts[0] == "apis":
		n = 3
	default:
		return "", "", false
	}
	rest := parts[n:]
	if len(rest) < 3 || len(rest) > 4 || rest[0] != "namespaces" || rest[1] == "" || rest[2] == "" {
		return "", "", false
	}
	coll = "/" + strings.Join(parts[:n+3], "/")
	if len(rest) == 4 {
		name = rest[3]
	}
	return coll, name, true
}

func selectorOf(r *http.Request) (selector, error) {
	l, err := kube.ParseSelector(r.URL.Query().Get("labelSelector"))
	if err != nil {
		return selector{}, err
	}
	f, err := parseReqs(r.URL.Query().Get("fieldSelector"))
	return selector{labels: l, fields: f}, err
}

func (s *Server) serveList(w http.ResponseWriter, r *http.Request, coll string) {
	sel, err := selectorOf(r)
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	}
	s.mu.Lock()
	s.lists++
	items := s.listLocked(coll, sel)
	rv := strconv.FormatInt(s.rv, 10)
	s.mu.Unlock()
	if items == nil {
		items = []map[string]any{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"kind": "List", "apiVersion": "v1",
		"metadata": map[string]any{"resourceVersion": rv}, "items": items})
}

func (s *Server) serveGet(w http.ResponseWriter, coll, name string) {
	m := s.Get(coll, name)
	if m == nil {
		writeStatus(w, http.StatusNotFound, "NotFound", name+" not found")
		return
	}
	writeJSON(w, http.StatusOK, m)
}

// serveWrite creates (POST) or updates (PUT) an object.
func (s *Server) serveWrite(w http.ResponseWriter, r *http.Request, coll, name string, create bool) {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes+1))
	if err != nil || len(b) > maxBodyBytes {
		writeStatus(w, http.StatusRequestEntityTooLarge, "RequestEntityTooLarge", "body too large")
		return
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	}
	if _, ok := m["metadata"].(map[string]any); !ok || nameOf(m) == "" || (!create && nameOf(m) != name) {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "metadata.name missing or not the path's")
		return
	}
	name = nameOf(m)
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, exists := s.objs[key{coll, name}]
	switch {
	case create && exists:
		writeStatus(w, http.StatusConflict, "AlreadyExists", name+" already exists")
		return
	case !create && !exists:
		writeStatus(w, http.StatusNotFound, "NotFound", name+" not found")
		return
	case !create && rvOf(m) != "" && rvOf(m) != rvOf(cur):
		writeStatus(w, http.StatusConflict, "Conflict", fmt.Sprintf("the object has been modified (resourceVersion %s, now %s)", rvOf(m), rvOf(cur)))
		return
	}
	typ := "ADDED"
	if exists {
		typ = "MODIFIED"
	}
	s.writeLocked(coll, name, typ, m)
	code := http.StatusOK
	if create {
		code = http.StatusCreated
	}
	writeJSON(w, code, m)
}

// serveWatch streams coll's changes after the requested version.
func (s *Server) serveWatch(w http.ResponseWriter, r *http.Request, coll string) {
	sel, err := selectorOf(r)
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	}
	q := r.URL.Query()
	bookmarks := q.Get("allowWatchBookmarks") == "true"
	timeout := time.Hour
	if t, err := strconv.Atoi(q.Get("timeoutSeconds")); err == nil && t > 0 {
		timeout = time.Duration(t) * time.Second
	}
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w) // one event a line
	send := func(typ string, obj any) bool {
		err := enc.Encode(map[string]any{"type": typ, "object": obj})
		if flusher != nil {
			flusher.Flush()
		}
		return err == nil
	}

	s.mu.Lock()
	s.watches++
	defer func() { s.mu.Lock(); s.watches--; s.mu.Unlock() }()
	var from int64
	var initial []map[string]any
	switch v := q.Get("resourceVersion"); v {
	case "", "0":
		from, initial = s.rv, s.listLocked(coll, sel)
	default:
		from, err = strconv.ParseInt(v, 10, 64)
		if err != nil || from < s.compacted {
			s.mu.Unlock()
			send("ERROR", status(http.StatusGone, "Expired", "too old resource version: "+v))
			return
		}
	}
	s.mu.Unlock()
	for _, m := range initial {
		if !send("ADDED", m) {
			return
		}
	}
	s.stream(r, coll, sel, from, bookmarks, timeout, send)
}

// stream sends the events after from until the client goes, the timeout
// passes or DropWatches.
func (s *Server) stream(r *http.Request, coll string, sel selector, from int64, bookmarks bool, timeout time.Duration, send func(string, any) bool) {
	end := time.NewTimer(timeout)
	defer end.Stop()
	every := s.BookmarkEvery
	if every <= 0 {
		every = 100 * time.Millisecond
	}
	bm := time.NewTicker(every)
	defer bm.Stop()
	for {
		s.mu.Lock()
		if from < s.compacted { // changes this watch had not sent are gone
			s.mu.Unlock()
			send("ERROR", status(http.StatusGone, "Expired", "too old resource version: "+strconv.FormatInt(from, 10)))
			return
		}
		var evs []event
		for _, e := range s.events {
			if e.rv <= from || e.coll != coll {
				continue
			}
			if typ, ok := e.as(sel); ok {
				e.typ = typ
				evs = append(evs, e)
			}
		}
		if n := len(s.events); n > 0 {
			from = max(from, s.events[n-1].rv)
		}
		changed, drop, rv := s.changed, s.drop, s.rv
		s.mu.Unlock()
		for _, e := range evs {
			if !send(e.typ, e.obj) {
				return
			}
		}
		select {
		case <-changed:
		case <-bm.C:
			if bookmarks && !send("BOOKMARK", map[string]any{"metadata": map[string]any{"resourceVersion": strconv.FormatInt(rv, 10)}}) {
				return
			}
		case <-drop:
			return
		case <-end.C:
			return
		case <-r.Context().Done():
			return
		}
	}
}

func status(code int, reason, msg string) map[string]any {
	st := "Failure"
	if code/100 == 2 {
		st = "Success"
	}
	return map[string]any{"kind": "Status", "apiVersion": "v1", "status": st, "reason": reason, "message": msg, "code": code}
}

func writeStatus(w http.ResponseWriter, code int, reason, msg string) {
	writeJSON(w, code, status(code, reason, msg))
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/kvrouter/kvrouter/route"
)

// The admin API's backend routes, on the admin surface (AdminHandler),
// behind its keys (Config.AdminAPIKeys):
//
//	GET    /admin/v1/backends          {"backends": [BackendState...]}
//	POST   /admin/v1/backends          {"url", "kv", "replay", "models", "role"}: add (201)
//	POST   /admin/v1/backends/drain    {"url"}: no new requests; streams finish (200)
//	POST   /admin/v1/backends/undrain  {"url"}: back to service (200)
//	DELETE /admin/v1/backends          {"url"}: remove (200, or 202 while its
//	                                   streams finish: they are not cut)
//
// A removal never cuts a stream: the backend leaves the routing at once
// (as a drain), its loops stop, and its requests in flight finish; it is
// listed with state "removed" until they have. Errors are OpenAI-shaped
// JSON and counted in kvrouter_admin_errors_total; every change is logged
// and counted in kvrouter_backend_changes_total.
const (
	pathBackends = "/admin/v1/backends"
	pathDrain    = "/admin/v1/backends/drain"
	pathUndrain  = "/admin/v1/backends/undrain"
)

// Bounds of an admin request body.
const (
	// maxAdminBody is the most bytes of an admin request body.
	maxAdminBody = 64 << 10
	// maxModels is the most models one backend declares; maxNameBytes the
	// longest model name or URL.
	maxModels    = 64
	maxNameBytes = 512
)

// Admin API error codes.
const (
	codeBadBody       = "invalid_body"
	codeBackendExists = "backend_exists"
	codeNoBackend     = "backend_not_found"
	codeFleetFull     = "fleet_full"
)

// backendBody is the body of the backend routes.
type backendBody struct {
	URL    string   `json:"url"`
	KV     string   `json:"kv"`
	Replay string   `json:"replay"`
	Models []string `json:"models"`
	// Role is "prefill", "decode" or "both" (empty: both).
	Role string     `json:"role"`
	role route.Role // Role, parsed by checkBackendBody
}

// backend is the Backend b adds.
func (b *backendBody) backend() Backend {
	return Backend{URL: b.URL, KV: b.KV, Replay: b.Replay, Models: b.Models, Role: b.role}
}

// routeBackends registers the backend routes on mux.
func (rt *Router) routeBackends(mux *http.ServeMux, count func(string)) {
	mux.HandleFunc("GET "+pathBackends, rt.serveBackends)
	mux.HandleFunc("POST "+pathBackends, rt.serveAddBackend)
	mux.HandleFunc("DELETE "+pathBackends, rt.serveRemoveBackend)
	mux.Handle(pathBackends, methodNotAllowed(count, "GET, HEAD, POST, DELETE"))
	handle(mux, http.MethodPost, pathDrain, rt.serveDrainBackend, count)
	handle(mux, http.MethodPost, pathUndrain, rt.serveUndrainBackend, count)
}

func (rt *Router) serveBackends(w http.ResponseWriter, r *http.Request) {
	list := rt.Backends()
	if list == nil {
		list = []BackendState{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"backends": list})
}

func (rt *Router) serveAddBackend(w http.ResponseWriter, r *http.Request) {
	b, ok := rt.readBackendBody(w, r, true)
	if !ok {
		return
	}
	err := rt.AddBackend(b.backend(), SourceAdmin)
	if err != nil {
		rt.writeMemberError(w, err)
		return
	}
	rt.writeBackend(w, http.StatusCreated, b.URL)
}

func (rt *Router) serveDrainBackend(w http.ResponseWriter, r *http.Request) {
	rt.serveBackendOp(w, r, rt.DrainBackend)
}

func (rt *Router) serveUndrainBackend(w http.ResponseWriter, r *http.Request) {
	rt.serveBackendOp(w, r, rt.UndrainBackend)
}

// serveBackendOp applies op (drain, undrain) to the backend the body names
// and answers its state.
func (rt *Router) serveBackendOp(w http.ResponseWriter, r *http.Request, op func(url, source string) error) {
	b, ok := rt.readBackendBody(w, r, false)
	if !ok {
		return
	}
	if err := op(b.URL, SourceAdmin); err != nil {
		rt.writeMemberError(w, err)
		return
	}
	rt.writeBackend(w, http.StatusOK, b.URL)
}

func (rt *Router) serveRemoveBackend(w http.ResponseWriter, r *http.Request) {
	b, ok := rt.readBackendBody(w, r, false)
	if !ok {
		return
	}
	n, err := rt.RemoveBackend(b.URL, SourceAdmin)
	if err != nil {
		rt.writeMemberError(w, err)
		return
	}
	status, state := http.StatusOK, "gone"
	if n > 0 {
		status, state = http.StatusAccepted, "removed"
	}
	writeJSON(w, status, map[string]any{"url": b.URL, "state": state, "in_flight": n})
}

// writeBackend answers with backend id's state.
func (rt *Router) writeBackend(w http.ResponseWriter, status int, id string) {
	for _, b := range rt.Backends() {
		if b.URL == id {
			writeJSON(w, status, b)
			return
		}
	}
	writeJSON(w, status, map[string]any{"url": id})
}

// readBackendBody reads and checks a backend route's body: one JSON
// object of at most maxAdminBody bytes, no unknown field, a valid url;
// with full the kv, replay, models and role fields too, which the other routes
// refuse. It answers the error itself (and counts it) when not ok.
func (rt *Router) readBackendBody(w http.ResponseWriter, r *http.Request, full bool) (backendBody, bool) {
	var b backendBody
	fail := func(msg string) (backendBody, bool) {
		rt.countAdmin(codeBadBody)
		writeError(w, http.StatusBadRequest, errInvalidRequest, codeBadBody, msg)
		return backendBody{}, false
	}
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAdminBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return fail(fmt.Sprintf("body larger than %d bytes", maxAdminBody))
		}
		return fail("reading the body: " + err.Error())
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return fail(`body must be a JSON object such as {"url": "http://10.0.0.5:8000"}: ` + err.Error())
	}
	if dec.More() {
		return fail("body must be one JSON object, got more after it")
	}
	if err := checkBackendBody(&b, full); err != nil {
		return fail(err.Error())
	}
	return b, true
}

// checkBackendBody validates b; full allows kv, replay, models and role.
func checkBackendBody(b *backendBody, full bool) error {
	b.URL = strings.TrimRight(strings.TrimSpace(b.URL), "/")
	if b.URL == "" {
		return errors.New(`"url" is required`)
	}
	if len(b.URL) > maxNameBytes {
		return fmt.Errorf(`"url" longer than %d bytes`, maxNameBytes)
	}
	if err := checkURL(b.URL); err != nil {
		return fmt.Errorf(`"url" %q: %v`, b.URL, err)
	}
	if !full && (b.KV != "" || b.Replay != "" || b.Models != nil || b.Role != "") {
		return errors.New(`only "url" is read here`)
	}
	var err error
	if b.role, err = route.ParseRole(b.Role); err != nil {
		return fmt.Errorf(`"role": %v`, err)
	}
	for _, e := range []struct{ name, v string }{{"kv", b.KV}, {"replay", b.Replay}} {
		if e.v != "" {
			if err := checkZMQEndpoint(e.v); err != nil {
				return fmt.Errorf("%q %q: %v", e.name, e.v, err)
			}
		}
	}
	if len(b.Models) > maxModels {
		return fmt.Errorf(`"models": at most %d, got %d`, maxModels, len(b.Models))
	}
	for _, m := range b.Models {
		if m == "" || len(m) > maxNameBytes || strings.ContainsAny(m, ",\n\r\t") {
			return fmt.Errorf(`"models": %q is not a model name`, m)
		}
	}
	return nil
}

// checkZMQEndpoint checks a tcp://host:port endpoint.
func checkZMQEndpoint(s string) error {
	hp, ok := strings.CutPrefix(s, "tcp://")
	if !ok {
		return errors.New("want tcp://host:port")
	}
	if _, _, err := net.SplitHostPort(hp); err != nil {
		return err
	}
	return nil
}

// writeMemberError answers a membership change that failed.
func (rt *Router) writeMemberError(w http.ResponseWriter, err error) {
	status, code := http.StatusBadRequest, codeBadBody
	switch {
	case errors.Is(err, ErrBackendExists):
		status, code = http.StatusConflict, codeBackendExists
	case errors.Is(err, ErrNoBackend):
		status, code = http.StatusNotFound, codeNoBackend
	case errors.Is(err, ErrFleetFull):
		status, code = http.StatusConflict, codeFleetFull
	}
	rt.countAdmin(code)
	writeError(w, status, errInvalidRequest, code, err.Error())
}

// writeJSON answers with v as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, errUnavailable, "internal", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

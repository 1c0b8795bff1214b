package proxy

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// surface is what the router's two HTTP surfaces check: keys, the
// pass-through list and the key decision records hash ids with.
type surface struct {
	apiKeys   *Keys // nil: the API asks for no key
	adminKeys *Keys // nil: the admin surface asks for no key
	pass      passList
	idKey     []byte // HMAC key of shown ids; nil: ids shown verbatim
}

// newSurface reads the key files and compiles the pass-through list.
func newSurface(cfg *Config) (surface, error) {
	s := surface{pass: newPassList(cfg.PassThrough)}
	var err error
	if cfg.APIKeys != "" {
		if s.apiKeys, err = ReadKeys(cfg.APIKeys); err != nil {
			return surface{}, fmt.Errorf("api-keys: %w", err)
		}
		if err = s.apiKeys.checkClasses(cfg.SLO.Classes); err != nil {
			return surface{}, fmt.Errorf("api-keys %s: %w", cfg.APIKeys, err)
		}
	}
	if cfg.AdminAPIKeys != "" {
		if s.adminKeys, err = ReadKeys(cfg.AdminAPIKeys); err != nil {
			return surface{}, fmt.Errorf("admin-api-keys: %w", err)
		}
	}
	if !cfg.DebugShowIDs {
		s.idKey = make([]byte, 32)
		rand.Read(s.idKey)
	}
	return s, nil
}

// shownID is id as decision records show it: a keyed hash ("h:" and 16
// hex digits), stable for the process's life and not reversible by
// trying likely values (e-mail addresses), or id itself when key is nil.
func shownID(key []byte, id string) string {
	if key == nil || id == "" {
		return id
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id))
	var sum [sha256.Size]byte
	return "h:" + hex.EncodeToString(m.Sum(sum[:0])[:8])
}

// handle registers h for method and path on mux, and a JSON 405 (counted
// by count) for the path's other methods.
func handle(mux *http.ServeMux, method, path string, h http.HandlerFunc, count func(string)) {
	mux.HandleFunc(method+" "+path, h)
	allow := method
	if method == http.MethodGet {
		allow = "GET, HEAD"
	}
	mux.Handle(path, methodNotAllowed(count, allow))
}

// AdminHandler returns the admin surface: the dashboard at /ui (package
// dashboard; /ui redirects to /ui/), /debug/decisions, /metrics, /livez,
// /readyz, the admin API's backend routes (backends.go) and, with Config.Pprof,
// /debug/pprof/ (pprof.go); any other path is a JSON 404. With Config.AdminAPIKeys
// every path but the probes asks for a key.
func (rt *Router) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	count := rt.countAdmin
	handle(mux, http.MethodGet, "/debug/decisions", rt.serveDecisions, count)
	handle(mux, http.MethodGet, "/livez", rt.serveLive, count)
	handle(mux, http.MethodGet, "/readyz", rt.serveReady, count)
	if rt.gatherer != nil {
		handle(mux, http.MethodGet, "/metrics", promhttp.HandlerFor(rt.gatherer, promhttp.HandlerOpts{}).ServeHTTP, count)
	}
	rt.routeBackends(mux, count)
	rt.routeRecord(mux, count)
	rt.routePprof(mux, count)
	mux.Handle("/ui/", rt.dash)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		count(codeUnknownURL)
		writeNotFound(w, r)
	})
	return &gate{keys: rt.sf.adminKeys, basic: true, count: count, next: canonical(count, mux)}
}

// countAPI counts an error the API surface answered.
func (rt *Router) countAPI(code string) { rt.m.errors.WithLabelValues(code).Inc() }

// countAdmin counts an error the admin surface answered.
func (rt *Router) countAdmin(code string) { rt.m.adminErrors.WithLabelValues(code).Inc() }

// validateSurface checks the drain, TLS, admin and pass-through settings.
func (c *Config) validateSurface() []error {
	var errs []error
	if c.DrainTimeout < 0 {
		errs = append(errs, fmt.Errorf("drain-timeout: must not be negative, got %s", c.DrainTimeout))
	}
	if c.AdminListen != "" {
		if _, _, err := net.SplitHostPort(c.AdminListen); err != nil {
			errs = append(errs, fmt.Errorf("admin-listen %q: %w", c.AdminListen, err))
		} else if c.AdminListen == c.Listen {
			errs = append(errs, fmt.Errorf("admin-listen %q: must differ from listen (the admin surface is kept off the API port)", c.AdminListen))
		}
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, errors.New("tls-cert and tls-key: give both or neither"))
	}
	for _, p := range c.PassThrough {
		if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, " \t\\%") || strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") {
			errs = append(errs, fmt.Errorf("pass-through %q: want a path prefix such as /v1/embeddings (\"/\": every path)", p))
		}
	}
	return errs
}

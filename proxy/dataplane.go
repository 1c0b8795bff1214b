package proxy

import (
	"net/http"
	"time"
)

// What a data plane that forwards requests itself (the endpoint picker,
// package epp) needs of the router beside Pick, so that its requests meet
// the limits serve's do.

// Authenticate checks r's API key as the HTTP API does (--api-keys):
// with keys configured, a request without a valid one is answered on w
// (401 invalid_api_key, counted in kvrouter_errors_total) and Authenticate
// returns false; otherwise it returns r carrying the key's name and
// default priority for Pick, its Authorization header removed (the key
// is the router's, not the replicas').
func (rt *Router) Authenticate(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	g := gate{keys: rt.sf.apiKeys, strip: true, count: rt.countAPI}
	return g.admit(w, r)
}

// UpstreamTimeouts returns the bounds serve puts on a replica's answer:
// ttft, the wait for its first byte (--ttft-timeout), and idle, its
// silence afterwards (--stream-idle-timeout); zero means none.
func (rt *Router) UpstreamTimeouts() (ttft, idle time.Duration) {
	return rt.cfg.TTFTTimeout, rt.cfg.StreamIdleTimeout
}

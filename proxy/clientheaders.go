package proxy

import (
	"context"
	"net/http"
	"strings"
)

// The routing headers (HeaderReplica, HeaderDecision) name the fleet's
// replicas and price the decision: topology a client past a trusted
// boundary should not see. They reach a client only when
// Config.ClientHeaders says so, or the client's API key does (a key
// file's "headers=on"; "headers=off" hides them from a key even with
// ClientHeaders). The decision itself is kept either way: in
// /debug/decisions, the access log and the trace.

// headerPrefix starts every routing header's canonical name.
const headerPrefix = "X-Kvrouter-"

// clientHeaders reports whether the request carrying ctx gets the
// routing headers: its API key's setting, else Config.ClientHeaders.
func (rt *Router) clientHeaders(ctx context.Context) bool {
	k, _ := ctx.Value(keyNameKey{}).(keyInfo)
	if k.headers != 0 {
		return k.headers > 0
	}
	return rt.cfg.ClientHeaders
}

// stripRouting deletes every X-Kvrouter-* header of h.
func stripRouting(h http.Header) {
	for k := range h {
		if strings.HasPrefix(http.CanonicalHeaderKey(k), headerPrefix) {
			delete(h, k)
		}
	}
}

// parseHeadersOption parses a key file's "headers=on|off" value: +1 on,
// −1 off.
func parseHeadersOption(v string) (int8, bool) {
	switch v {
	case "on", "true":
		return 1, true
	case "off", "false":
		return -1, true
	}
	return 0, false
}

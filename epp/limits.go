package epp

import (
	"context"
	"time"
)

// The picker's requests meet serve's limits: the API keys (--api-keys)
// are checked when the request headers arrive, before any of the body is
// held, and a routed stream may stay silent before its response starts
// no longer than serve waits for a replica's first byte (--ttft-timeout),
// so that streams that route and then say nothing hold the replicas'
// load for a bounded time, not for IdleTimeout.

// authenticate checks the request's API key as serve does, answering 401
// invalid_api_key (counted in kvrouter_errors_total) when it is missing
// or wrong. The key's name and priority go with the request to Pick
// (st.ctx), and Envoy is told to drop the Authorization header (dropAuth),
// as serve does not pass the router's key to the replicas.
func (st *stream) authenticate() (bool, error) {
	r, err := st.request()
	if err != nil {
		return true, nil // route answers invalid_path
	}
	had := st.header.Get("Authorization") != ""
	var ans answer
	r, ok := st.s.rt.Authenticate(&ans, r)
	if !ok {
		st.s.m.requests.WithLabelValues("answered").Inc()
		return false, st.immediate(ans.code(), ans.Header(), ans.body.Bytes(), "router answered 401")
	}
	st.ctx = r.Context()
	st.dropAuth = had && st.header.Get("Authorization") == ""
	return true, nil
}

// context is the request's context: the stream's, with the request's API
// key once authenticated.
func (st *stream) context() context.Context {
	if st.ctx != nil {
		return st.ctx
	}
	return st.srv.Context()
}

// silence returns how long a routed stream may now go without a message,
// and the error code when it does: until the response's headers, the
// router's --ttft-timeout (when shorter than IdleTimeout); after them,
// IdleTimeout.
func (st *stream) silence() (time.Duration, string) {
	if ttft, _ := st.s.rt.UpstreamTimeouts(); st.status == 0 && ttft > 0 && ttft < st.s.cfg.IdleTimeout {
		return ttft, "ttft_timeout"
	}
	return st.s.cfg.IdleTimeout, "idle_timeout"
}

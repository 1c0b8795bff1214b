package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// apiError is the OpenAI error shape: {"error":{"message","type","code"}}.
type apiError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    any    `json:"code"`
	} `json:"error"`
}

// OpenAI error types the router answers with.
const (
	errInvalidRequest = "invalid_request_error"
	errUnavailable    = "service_unavailable"
	errUpstream       = "upstream_error"
)

// codeStreamCut is the error code of the event that ends a stream the
// replica cut before its end.
const codeStreamCut = "upstream_stream_cut"

// writeError answers with status and an OpenAI-shaped error body.
func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	var e apiError
	e.Error.Message = msg
	e.Error.Type = typ
	e.Error.Code = code
	b, _ := json.Marshal(&e)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// writeUnavailable answers 503 with Retry-After, in seconds (at least 1).
func writeUnavailable(w http.ResponseWriter, retryAfter time.Duration, msg string) {
	s := int((retryAfter + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	w.Header().Set("Retry-After", strconv.Itoa(s))
	writeError(w, http.StatusServiceUnavailable, errUnavailable, "no_healthy_replica", msg)
}

// Error codes of the router's own surface: unknown paths, wrong methods,
// keys and shutdown.
const (
	codeUnknownURL       = "unknown_url"
	codeMethodNotAllowed = "method_not_allowed"
	codeInvalidKey       = "invalid_api_key"
	codeShuttingDown     = "server_shutting_down"
)

// writeNotFound answers 404 in OpenAI's words for a path the router does
// not serve (or does not pass through).
func writeNotFound(w http.ResponseWriter, r *http.Request) {
	writeError(w, http.StatusNotFound, errInvalidRequest, codeUnknownURL,
		"Invalid URL ("+r.Method+" "+r.URL.Path+")")
}

// methodNotAllowed returns a handler answering 405 with an Allow header,
// in JSON, for a path served under other methods.
func methodNotAllowed(count func(code string), allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		count(codeMethodNotAllowed)
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, errInvalidRequest, codeMethodNotAllowed,
			"Method "+r.Method+" is not allowed on "+r.URL.Path+" (allowed: "+allow+")")
	}
}

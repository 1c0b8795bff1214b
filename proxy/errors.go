package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/prefix"
	"github.com/kvrouter/kvrouter/sse"
)

// apiError is the OpenAI error shape,
// {"error":{"message","type","param","code"}}: param names the request
// field at fault (null when none is), code is a string a client can
// switch on (null only when an upstream gave none).
type apiError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Param   any    `json:"param"`
		Code    any    `json:"code"`
	} `json:"error"`
}

// OpenAI error types the router answers with.
const (
	errInvalidRequest = "invalid_request_error"
	errUnavailable    = "service_unavailable"
	errUpstream       = "upstream_error"
	errServer         = "server_error"
)

// codeStreamCut is the error code of the event that ends a stream the
// replica cut before its end.
const codeStreamCut = sse.CodeStreamCut

// writeError answers with status and an OpenAI-shaped error body whose
// param is null.
func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	writeParamError(w, status, typ, code, "", msg)
}

// writeParamError is writeError naming the request field at fault, param
// ("" for none: null).
func writeParamError(w http.ResponseWriter, status int, typ, code, param, msg string) {
	b := errorBody(typ, code, param, msg)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

// errorBody is the JSON of an OpenAI error, newline-terminated; an empty
// param or code is null.
func errorBody(typ string, code any, param, msg string) []byte {
	var e apiError
	e.Error.Message, e.Error.Type, e.Error.Code = msg, typ, code
	if param != "" {
		e.Error.Param = param
	}
	if code == "" {
		e.Error.Code = nil
	}
	b, _ := json.Marshal(&e)
	return append(b, '\n')
}

// writeUnavailable answers 503 code with Retry-After, in seconds (at
// least 1).
func writeUnavailable(w http.ResponseWriter, retryAfter time.Duration, code, msg string) {
	s := int((retryAfter + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	w.Header().Set("Retry-After", strconv.Itoa(s))
	writeError(w, http.StatusServiceUnavailable, errUnavailable, code, msg)
}

// Error codes of the router's own surface: unknown paths, wrong methods,
// keys, shutdown and an empty fleet.
const (
	codeUnknownURL       = "unknown_url"
	codeMethodNotAllowed = "method_not_allowed"
	codeInvalidKey       = "invalid_api_key"
	codeShuttingDown     = "server_shutting_down"
	codeNoHealthy        = "no_healthy_replica"
	codeNoReplica        = "no_replica" // the fleet is empty: none configured or discovered
	codeModelNotFound    = "model_not_found"
)

// noReplica returns the code and message of a 503 for want of a replica:
// no_replica when the fleet has none in service (empty, or all draining),
// else no_healthy_replica.
func (rt *Router) noReplica() (code, msg string) {
	if rt.st.fleet.Serving() == 0 {
		return codeNoReplica, "no replica: none configured, discovered or left in service"
	}
	return codeNoHealthy, "no healthy replica can take the request"
}

// writeNoReplica answers 503 for want of a replica (noReplica) and
// returns its code.
func (rt *Router) writeNoReplica(w http.ResponseWriter) string {
	code, msg := rt.noReplica()
	writeUnavailable(w, rt.cfg.HealthInterval, code, msg)
	return code
}

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

// maxUpstreamError is the most of an upstream error body read to reshape
// it; the rest is dropped.
const maxUpstreamError = 64 << 10

// reshapeError makes an upstream error response (status 400 or more, not a
// stream) OpenAI-shaped: a body that already is passes unchanged; any
// other (Go's and FastAPI's plain 404 and 405, vLLM's older top-level
// {"object":"error","message",...}, text) is replaced by an OpenAI error
// carrying the upstream's message, status and headers (Allow included).
// The router's own answers on pass-through routes are shaped the same.
func reshapeError(resp *http.Response) {
	if resp.StatusCode < 400 || resp.Body == nil || resp.Body == http.NoBody ||
		resp.Request != nil && resp.Request.Method == http.MethodHead || resp.Header.Get("Content-Encoding") != "" {
		return
	}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "text/event-stream" {
		return
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxUpstreamError))
	resp.Body.Close()
	if err == nil && openAIShaped(raw) {
		resp.Body = io.NopCloser(bytes.NewReader(raw))
		resp.ContentLength = int64(len(raw))
		resp.Header.Set("Content-Length", strconv.Itoa(len(raw)))
		return
	}
	msg, code := upstreamMessage(raw, resp.StatusCode)
	b := errorBody(errorType(resp.StatusCode), code, "", msg)
	resp.Body = io.NopCloser(bytes.NewReader(b))
	resp.ContentLength = int64(len(b))
	resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
	resp.Header.Set("Content-Type", "application/json")
}

// openAIShaped reports whether b is a JSON object whose "error" member is
// an object with a string message.
func openAIShaped(b []byte) bool {
	var v struct {
		Error *struct {
			Message *string `json:"message"`
		} `json:"error"`
	}
	return json.Unmarshal(b, &v) == nil && v.Error != nil && v.Error.Message != nil
}

// upstreamMessage finds the message of an upstream error body (vLLM's
// "message", FastAPI's "detail", or the text itself) and a code for it:
// the upstream's own string code, else unknown_url for a 404 and
// method_not_allowed for a 405, else "" (null).
func upstreamMessage(raw []byte, status int) (msg string, code string) {
	var v struct {
		Message string `json:"message"`
		Detail  any    `json:"detail"`
		Code    any    `json:"code"`
	}
	if json.Unmarshal(raw, &v) == nil {
		msg = v.Message
		if d, ok := v.Detail.(string); ok && msg == "" {
			msg = d
		}
		code, _ = v.Code.(string)
	}
	if msg == "" && !json.Valid(raw) {
		msg = strings.TrimSpace(strings.ToValidUTF8(string(raw), "\uFFFD"))
	}
	if msg == "" {
		msg = http.StatusText(status)
	}
	if len(msg) > 1024 {
		msg = msg[:1024] + "…"
	}
	if code == "" {
		switch status {
		case http.StatusNotFound:
			code = codeUnknownURL
		case http.StatusMethodNotAllowed:
			code = codeMethodNotAllowed
		}
	}
	return "upstream replica: " + msg, code
}

// errorType is OpenAI's error type for an HTTP status.
func errorType(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return "authentication_error"
	case status == http.StatusForbidden:
		return "permission_error"
	case status == http.StatusTooManyRequests:
		return errRateLimit
	case status >= 500:
		return errServer
	}
	return errInvalidRequest
}

// parseErrorOf maps an error of prefix.Parse (not a limit error) to an
// OpenAI error code, the param at fault and a message; path is the
// request's (a missing prompt is "messages" in chat, "prompt" otherwise).
func parseErrorOf(err error, path string) (code, param, msg string) {
	var fe *prefix.FieldError
	switch {
	case errors.Is(err, prefix.ErrNoModel):
		return "missing_model", "model", "you must provide a model parameter"
	case errors.Is(err, prefix.ErrNoPrompt):
		param = "prompt"
		if path == "/v1/chat/completions" {
			param = "messages"
		}
		return "missing_prompt", param, err.Error()
	case errors.As(err, &fe) && errors.Is(err, prefix.ErrRange):
		return "integer_below_min_value", fe.Field, "Invalid '" + fe.Field + "': " + fe.Err.Error()
	case errors.As(err, &fe) && errors.Is(err, prefix.ErrType):
		return "invalid_type", fe.Field, "Invalid type for '" + fe.Field + "': " + fe.Err.Error()
	}
	return "invalid_json", "", "We could not parse the JSON body of your request: " + err.Error()
}

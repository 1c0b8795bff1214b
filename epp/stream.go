package epp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvrouter/kvrouter/proxy"
)

// stream is one ext_proc stream: one HTTP request's headers, body and
// response as Envoy passes them. Only run's goroutine touches it, but for
// the reader, which only Recvs.
type stream struct {
	s        *Server
	srv      extprocv3.ExternalProcessor_ProcessServer
	in       chan received
	first    bool     // no message handled yet
	reqMode  BodyMode // request body mode
	partial  bool     // BUFFERED_PARTIAL: a body message without end of stream is cut at Envoy's buffer
	respEcho bool     // the response body mode is FULL_DUPLEX_STREAMED: chunks are sent back
	method   string
	path     string
	header   http.Header
	subset   []string // endpoints Envoy allows; nil: any
	body     []byte
	held     int64           // bytes the body took from the budget (budget.go)
	ctx      context.Context // the request's, with its API key (limits.go); nil: the stream's
	dropAuth bool            // Envoy must drop the Authorization header (limits.go)
	started  bool            // the request headers arrived
	pick     *proxy.Pick
	status   int  // the upstream's response status
	gotFirst bool // the first response body bytes arrived
	usage    usageTail
	complete bool // the response reached its end
}

// received is one Recv's outcome.
type received struct {
	req *extprocv3.ProcessingRequest
	err error
}

func newStream(s *Server, srv extprocv3.ExternalProcessor_ProcessServer) *stream {
	mode := s.cfg.BodyMode
	return &stream{s: s, srv: srv, in: make(chan received, 1), first: true, reqMode: mode, respEcho: mode == FullDuplex}
}

// read receives the stream's messages until it ends: Envoy closes it, or
// the handler's return cancels it.
func (st *stream) read() {
	ctx := st.srv.Context()
	for {
		req, err := st.srv.Recv()
		select {
		case st.in <- received{req, err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// errDone ends a stream that has nothing more to do (an immediate
// response was sent).
var errDone = errors.New("stream done")

// run serves the stream until it ends. The request body must be complete
// within BodyTimeout of the start; once routed, the stream may be silent
// for the router's TTFT timeout at most until the response headers, then
// for IdleTimeout (silence, limits.go).
func (st *stream) run() error {
	s := st.s
	s.m.streams.Inc()
	defer s.m.streams.Dec()
	defer func() { st.pick.Done(st.complete, st.usage.usage()) }()
	defer st.giveBody()
	s.readers.Go(st.read)
	ctx := st.srv.Context()
	timer := time.NewTimer(s.cfg.BodyTimeout)
	defer timer.Stop()
	for {
		select {
		case r := <-st.in:
			if r.err != nil {
				if r.err == io.EOF || status.Code(r.err) == codes.Canceled {
					return nil
				}
				return r.err
			}
			err := st.handle(r.req)
			if errors.Is(err, errDone) {
				return nil
			}
			if err != nil {
				return err
			}
			if st.pick != nil { // once routed, every message restarts the silence timer
				d, _ := st.silence()
				timer.Reset(d) // Go ≥ 1.23 timers: no stale tick survives Reset
			}
		case <-timer.C:
			if st.pick == nil {
				st.fail(http.StatusRequestTimeout, "body_timeout", fmt.Sprintf("request body not received within %s", s.cfg.BodyTimeout))
				return nil
			}
			d, code := st.silence()
			s.m.errors.WithLabelValues(code).Inc()
			return status.Errorf(codes.DeadlineExceeded, "stream silent for %s (%s)", d, code)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// handle answers one message.
func (st *stream) handle(req *extprocv3.ProcessingRequest) error {
	if st.first {
		st.first = false
		st.modes(req.GetProtocolConfig())
	}
	switch v := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.requestHeaders(req, v.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.requestBody(v.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return st.requestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		st.served(req)
		return st.responseHeaders(v.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return st.responseBody(v.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		st.complete = true
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}})
	}
	return st.protocolError("unexpected message %T", req.GetRequest())
}

// modes takes the body modes from Envoy's protocol_config, when it sent
// one. A request body mode the picker cannot route on (STREAMED, NONE)
// is kept as -1 and refused when a body is announced.
func (st *stream) modes(pc *extprocv3.ProtocolConfiguration) {
	if pc == nil {
		return
	}
	switch pc.GetRequestBodyMode() {
	case procv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		st.reqMode = FullDuplex
	case procv3.ProcessingMode_BUFFERED, procv3.ProcessingMode_BUFFERED_PARTIAL:
		st.reqMode = Buffered
		st.partial = pc.GetRequestBodyMode() == procv3.ProcessingMode_BUFFERED_PARTIAL
	default:
		st.reqMode = -1
	}
	st.respEcho = pc.GetResponseBodyMode() == procv3.ProcessingMode_FULL_DUPLEX_STREAMED
}

// requestHeaders reads the request's method, path, headers and the
// endpoint subset Envoy allows. A request without a body is routed at
// once; in BUFFERED mode the headers are let through at once (the
// routing rides on the body's answer); in FULL_DUPLEX_STREAMED mode they
// are answered once the body is complete.
func (st *stream) requestHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	if st.started {
		return st.protocolError("request headers sent twice")
	}
	st.started = true
	st.header = http.Header{}
	for _, hv := range h.GetHeaders().GetHeaders() {
		v := string(hv.GetRawValue())
		if v == "" {
			v = hv.GetValue()
		}
		switch k := hv.GetKey(); k {
		case ":method":
			st.method = v
		case ":path":
			st.path = v
		default:
			if !strings.HasPrefix(k, ":") {
				st.header.Add(k, v)
			}
		}
	}
	st.subset = subsetOf(req, st.s.cfg.Namespace)
	if ok, err := st.authenticate(); !ok {
		return err
	}
	if h.GetEndOfStream() {
		return st.route(false)
	}
	if ok, err := st.takeDeclared(); !ok {
		return err
	}
	switch st.reqMode {
	case Buffered:
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{}}})
	case FullDuplex:
		return nil
	}
	return st.fail(http.StatusInternalServerError, "unsupported_body_mode",
		"the endpoint picker needs the ext_proc filter's request_body_mode BUFFERED or FULL_DUPLEX_STREAMED")
}

// requestBody collects the body, up to MaxBodyBytes, and routes at its
// end: the last chunk in FULL_DUPLEX_STREAMED mode, the one message in
// BUFFERED mode (whose end_of_stream is false when trailers follow).
func (st *stream) requestBody(b *extprocv3.HttpBody) error {
	if !st.started || st.pick != nil {
		return st.protocolError("request body out of order")
	}
	if int64(len(st.body))+int64(len(b.GetBody())) > st.s.cfg.MaxBodyBytes {
		return st.tooLarge()
	}
	if ok, err := st.takeChunk(len(b.GetBody())); !ok {
		return err
	}
	st.body = append(st.body, b.GetBody()...)
	switch {
	case b.GetEndOfStream():
	case st.partial: // past Envoy's buffer: only the start of the body
		return st.fail(http.StatusRequestEntityTooLarge, "request_too_large", "request body is larger than the proxy's buffer")
	case st.reqMode == FullDuplex:
		return nil // more chunks follow
	}
	// BUFFERED: the whole body, trailers perhaps to follow.
	return st.route(true)
}

// tooLarge answers 413 request_too_large.
func (st *stream) tooLarge() error {
	return st.fail(http.StatusRequestEntityTooLarge, "request_too_large", fmt.Sprintf("request body is larger than %d bytes", st.s.cfg.MaxBodyBytes))
}

// requestTrailers ends a body that trailers end, and lets them through.
func (st *stream) requestTrailers() error {
	if st.pick == nil {
		if err := st.route(true); err != nil {
			return err
		}
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
}

// route picks the replica and tells Envoy: in the answer to the headers
// (no body, or FULL_DUPLEX_STREAMED, where the body follows, whole) or to
// the body (BUFFERED). A request the router does not route is answered
// with an immediate response, as the HTTP router would answer it.
func (st *stream) route(hasBody bool) error {
	r, err := st.request()
	if err != nil {
		return st.fail(http.StatusBadRequest, "invalid_path", err.Error())
	}
	if m := st.s.objectives.Load(); m != nil {
		objectivePriority(r.Header, *m)
	}
	var ans answer
	p := st.s.rt.Pick(&ans, r, st.body, st.subset)
	if p == nil {
		st.s.m.requests.WithLabelValues("answered").Inc()
		return st.immediate(ans.code(), ans.Header(), ans.body.Bytes(), "router answered "+strconv.Itoa(ans.code()))
	}
	st.pick = p
	st.s.m.requests.WithLabelValues("routed").Inc()
	dest := p.Endpoint()
	if n := st.s.cfg.Fallbacks; n > 0 {
		dest = strings.Join(append([]string{dest}, p.Fallbacks(n, st.subset)...), ",")
	}
	mut := st.destination(dest, hasBody && st.reqMode == FullDuplex)
	md := metadata(st.s.cfg.Namespace, st.s.cfg.Header, dest)
	common := &extprocv3.CommonResponse{HeaderMutation: mut, ClearRouteCache: true}
	if !hasBody || st.reqMode == FullDuplex {
		if err := st.send(&extprocv3.ProcessingResponse{
			Response:        &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}},
			DynamicMetadata: md,
		}); err != nil || !hasBody {
			return err
		}
		body := &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: st.body, EndOfStream: true}}}
		return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
			RequestBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: body}}}})
	}
	return st.send(&extprocv3.ProcessingResponse{
		Response:        &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}},
		DynamicMetadata: md,
	})
}

// maxPriority is proxy.HeaderPriority's bound.
const maxPriority = 1000

// objectivePriority sets h's proxy.HeaderPriority from the
// InferenceObjective it names (ObjectiveHeader), when prio has it: the
// pool's declaration replaces what the client sent. An unknown objective
// changes nothing.
func objectivePriority(h http.Header, prio map[string]int) {
	name := h.Get(ObjectiveHeader)
	if name == "" {
		return
	}
	if p, ok := prio[name]; ok {
		h.Set(proxy.HeaderPriority, strconv.Itoa(min(max(p, -maxPriority), maxPriority)))
	}
}

// request builds the http.Request the router reads: method, path and
// headers, on the stream's context (an admission queue waits no longer
// than the stream lasts).
func (st *stream) request() (*http.Request, error) {
	if st.path == "" || st.path[0] != '/' {
		return nil, fmt.Errorf("request path %q is not absolute", st.path)
	}
	u, err := url.ParseRequestURI(st.path)
	if err != nil {
		return nil, fmt.Errorf("request path: %w", err)
	}
	method := st.method
	if method == "" {
		method = http.MethodGet
	}
	r := &http.Request{Method: method, URL: u, Header: st.header, Host: st.header.Get("Host")}
	return r.WithContext(st.context()), nil
}

// destination sets the picked endpoint's header, replacing any the client
// sent, and with the body sent back (FULL_DUPLEX_STREAMED) its length.
func (st *stream) destination(endpoint string, withLength bool) *extprocv3.HeaderMutation {
	set := []*corev3.HeaderValueOption{setHeader(st.s.cfg.Header, endpoint)}
	if withLength {
		set = append(set, setHeader("content-length", strconv.Itoa(len(st.body))))
	}
	mut := &extprocv3.HeaderMutation{SetHeaders: set}
	if st.dropAuth {
		mut.RemoveHeaders = []string{"authorization"}
	}
	return mut
}

// served reads the endpoint the data plane says served the request
// (filter metadata envoy.lb, key ServedKey) into the decision record,
// and counts whether it was the picked one or a fallback.
func (st *stream) served(req *extprocv3.ProcessingRequest) {
	if st.pick == nil {
		return
	}
	ep := req.GetMetadataContext().GetFilterMetadata()[st.s.cfg.Namespace].GetFields()[ServedKey].GetStringValue()
	switch {
	case ep == "":
		st.s.m.served.WithLabelValues("unreported").Inc()
		return
	case ep == st.pick.Endpoint():
		st.s.m.served.WithLabelValues("primary").Inc()
	default:
		st.s.m.served.WithLabelValues("fallback").Inc()
	}
	st.pick.Served(ep)
}

// responseHeaders notes the upstream's status and adds the routing
// headers the HTTP router adds (X-Kvrouter-Replica, X-Kvrouter-Decision)
// when the client may see them (--client-headers), else removes any the
// upstream sent.
func (st *stream) responseHeaders(h *extprocv3.HttpHeaders) error {
	if st.pick == nil {
		return st.protocolError("response before the request was routed")
	}
	for _, hv := range h.GetHeaders().GetHeaders() {
		if hv.GetKey() == ":status" {
			v := string(hv.GetRawValue())
			if v == "" {
				v = hv.GetValue()
			}
			st.status, _ = strconv.Atoi(v)
		}
	}
	st.pick.Respond(st.status)
	mut := &extprocv3.HeaderMutation{RemoveHeaders: []string{strings.ToLower(proxy.HeaderReplica), strings.ToLower(proxy.HeaderDecision)}}
	if st.pick.ClientHeaders() {
		mut = &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(proxy.HeaderReplica, st.pick.Replica())}}
		if d := st.pick.Summary(); d != "" {
			mut.SetHeaders = append(mut.SetHeaders, setHeader(proxy.HeaderDecision, d))
		}
	}
	if h.GetEndOfStream() {
		st.complete = true
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{HeaderMutation: mut}}}})
}

// responseBody passes a response chunk on: its first bytes end the
// replica's prefill, the last chunk completes the request; the usage the
// engine reports at the end is read from the body's tail.
func (st *stream) responseBody(b *extprocv3.HttpBody) error {
	if st.pick == nil {
		return st.protocolError("response before the request was routed")
	}
	if len(b.GetBody()) > 0 && !st.gotFirst {
		st.gotFirst = true
		st.pick.FirstByte(st.s.now())
	}
	st.usage.write(b.GetBody())
	if b.GetEndOfStream() {
		st.complete = true
	}
	resp := &extprocv3.BodyResponse{}
	if st.respEcho {
		resp.Response = &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: b.GetBody(), EndOfStream: b.GetEndOfStream()}}}}
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: resp}})
}

// send sends one answer to Envoy.
func (st *stream) send(resp *extprocv3.ProcessingResponse) error {
	if err := st.srv.Send(resp); err != nil {
		return fmt.Errorf("epp send: %w", err)
	}
	return nil
}

// fail answers the request with an immediate OpenAI-style JSON error,
// counted under code, and ends the stream.
func (st *stream) fail(code int, errCode, msg string) error {
	st.s.m.errors.WithLabelValues(errCode).Inc()
	h := http.Header{"Content-Type": {"application/json"}}
	return st.immediate(code, h, errorBody(code, errCode, msg), errCode)
}

// protocolError ends a stream whose messages break the ext_proc order;
// Envoy sees a gRPC error (and applies its failure_mode_allow).
func (st *stream) protocolError(format string, args ...any) error {
	st.s.m.errors.WithLabelValues("protocol_error").Inc()
	return status.Errorf(codes.InvalidArgument, "ext_proc: "+format, args...)
}

// immediate sends Envoy an immediate response and ends the stream.
func (st *stream) immediate(code int, h http.Header, body []byte, details string) error {
	var set []*corev3.HeaderValueOption
	for k, vs := range h {
		if k == "Content-Length" { // Envoy sets it for the body it sends
			continue
		}
		for _, v := range vs {
			set = append(set, setHeader(k, v))
		}
	}
	ir := &extprocv3.ImmediateResponse{Status: httpStatus(code), Body: body, Details: details}
	if len(set) > 0 {
		ir.Headers = &extprocv3.HeaderMutation{SetHeaders: set}
	}
	if err := st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: ir}}); err != nil {
		return err
	}
	return errDone
}

package epp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	procv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/proxy"
)

// This file is the test's Envoy: it drives the picker over real gRPC on
// loopback with the ext_proc messages Envoy's filter sends, in the order
// and body mode it sends them, and forwards the request to the endpoint
// the picker named (a real emulated engine) as Envoy's ORIGINAL_DST
// cluster would, streaming the response back through the picker.

// fixture is a picker in front of emulated engines.
type fixture struct {
	reps   []*emulator.Server
	rt     *proxy.Router
	srv    *Server
	reg    *prometheus.Registry
	conn   *grpc.ClientConn
	client extprocv3.ExternalProcessorClient
}

// start runs n emulated engines, a router over them, the picker with cfg
// on a loopback gRPC server, and a client.
func start(t *testing.T, n int, cfg Config, mod func(*proxy.Config)) *fixture {
	t.Helper()
	f := &fixture{reg: prometheus.NewRegistry()}
	pcfg := proxy.DefaultConfig()
	pcfg.Policy = "kv-aware"
	pcfg.ClientHeaders = true // the tests read the routing headers
	pcfg.HealthInterval = 50 * time.Millisecond
	for range n {
		s, err := emulator.Start(emulator.Config{Model: "m", Preset: "llama3-8b-h100", TimeScale: 0.01}, "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		f.reps = append(f.reps, s)
		pcfg.Backends = append(pcfg.Backends, proxy.Backend{URL: s.URL()})
	}
	if mod != nil {
		mod(&pcfg)
	}
	rt, err := proxy.New(pcfg, proxy.Deps{Registry: f.reg})
	if err != nil {
		t.Fatal(err)
	}
	f.rt = rt
	if f.srv, err = New(rt, cfg, f.reg, nil); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := f.srv.NewGRPCServer()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 3)
	go func() { done <- rt.Run(ctx) }()
	go func() { done <- f.srv.Run(ctx) }()
	go func() { done <- g.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		g.Stop()
		cancel()
		for range 3 {
			if err := <-done; err != nil && err != grpc.ErrServerStopped {
				t.Errorf("stop: %v", err)
			}
		}
	})
	f.conn, f.client = conn, extprocv3.NewExternalProcessorClient(conn)
	return f
}

// exchange is what one request through the test's Envoy saw.
type exchange struct {
	immediate   *extprocv3.ImmediateResponse // the picker answered the request itself
	list        string                       // the destination header the picker set: primary,fallback,...
	endpoint    string                       // its primary, the first
	metadata    string                       // the envoy.lb destination in the dynamic metadata
	served      string                       // the endpoint that answered, reported back as Envoy does
	sentBody    []byte                       // the body Envoy forwards
	status      int                          // the engine's status
	respBody    []byte                       // the response body the client gets
	respHeaders map[string]string            // headers the picker added to the response
	respRemove  []string                     // headers the picker removed from the response
}

// req is one request the test's Envoy forwards.
type req struct {
	mode    procv3.ProcessingMode_BodySendMode // request and response body mode
	path    string
	headers []string // key, value pairs
	chunks  [][]byte // the body as Envoy's buffer delivers it
	subset  []string // the envoy.lb.subset_hint list; nil: none
	hint    any      // the subset hint's value as given (a string or []any), instead of subset
	open    bool     // the last chunk does not end the stream (Envoy's buffer cut it)
	// hold, when set, runs after the picker routed the request and before
	// the engine is called (to look at the router's load).
	hold func(endpoint string)
}

func chat(model, session, content string, stream bool) req {
	body := fmt.Sprintf(`{"model":%q,"max_tokens":4,"stream":%v,"messages":[{"role":"user","content":%q}]}`, model, stream, content)
	if stream {
		body = body[:len(body)-1] + `,"stream_options":{"include_usage":true}}`
	}
	return req{mode: procv3.ProcessingMode_FULL_DUPLEX_STREAMED, path: "/v1/chat/completions",
		headers: []string{"x-session-id", session, "content-type", "application/json"}, chunks: [][]byte{[]byte(body)}}
}

// hintMetadata is the filter metadata of Envoy's subset hint with the
// value hint (a string or []any).
func hintMetadata(t *testing.T, hint any) *corev3.Metadata {
	t.Helper()
	v, err := structpb.NewStruct(map[string]any{SubsetKey: hint})
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{DefaultNamespace + ".subset_hint": v}}
}

// headerMap is an ext_proc header map, with raw values as Envoy sends
// them.
func headerMap(kv ...string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: kv[i], RawValue: []byte(kv[i+1])})
	}
	return m
}

// do sends r through the picker and, when it was routed, to the engine.
func (f *fixture) do(t *testing.T, r req) exchange {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := f.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ex exchange
	hdrs := append([]string{":method", "POST", ":path", r.path, ":authority", "gw", ":scheme", "http"}, r.headers...)
	first := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(hdrs...), EndOfStream: len(r.chunks) == 0}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: r.mode, ResponseBodyMode: r.mode},
	}
	if r.subset != nil && r.hint == nil {
		list := make([]any, len(r.subset))
		for i, e := range r.subset {
			list[i] = e
		}
		r.hint = list
	}
	if r.hint != nil {
		first.MetadataContext = hintMetadata(t, r.hint)
	}
	send(t, s, first)
	if r.mode != procv3.ProcessingMode_FULL_DUPLEX_STREAMED && len(r.chunks) > 0 { // Envoy waits for the headers' answer
		resp := recv(t, s)
		if ex.immediate = resp.GetImmediateResponse(); ex.immediate != nil {
			return ex
		}
		if resp.GetRequestHeaders() == nil {
			t.Fatalf("buffered: got %T, want the headers' answer", resp.GetResponse())
		}
	}
	for i, c := range r.chunks {
		send(t, s, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: c, EndOfStream: i == len(r.chunks)-1 && !r.open}}})
	}
	body := bytes.Join(r.chunks, nil)
	if !f.routed(t, s, r, &ex, body) {
		return ex
	}
	if r.hold != nil {
		r.hold(ex.endpoint)
	}
	f.forward(t, s, r, &ex)
	return ex
}

// routed reads the picker's routing answers: the headers' (and the
// body's) in FULL_DUPLEX_STREAMED mode, the body's in BUFFERED mode.
func (f *fixture) routed(t *testing.T, s extprocv3.ExternalProcessor_ProcessClient, r req, ex *exchange, body []byte) bool {
	t.Helper()
	resp := recv(t, s)
	if ex.immediate = resp.GetImmediateResponse(); ex.immediate != nil {
		return false
	}
	var common *extprocv3.CommonResponse
	switch {
	case r.mode == procv3.ProcessingMode_BUFFERED && len(r.chunks) > 0:
		common = resp.GetRequestBody().GetResponse()
		ex.sentBody = body // BUFFERED: no mutation, Envoy forwards its own buffer
	default:
		common = resp.GetRequestHeaders().GetResponse()
	}
	if common == nil {
		t.Fatalf("got %T, want the routing answer", resp.GetResponse())
	}
	if !common.GetClearRouteCache() {
		t.Error("routing answer does not clear the route cache")
	}
	for _, h := range common.GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == DefaultHeader {
			ex.list = string(h.GetHeader().GetRawValue())
			ex.endpoint, _, _ = strings.Cut(ex.list, ",")
		}
	}
	ex.metadata = resp.GetDynamicMetadata().GetFields()[DefaultNamespace].GetStructValue().GetFields()[DefaultHeader].GetStringValue()
	if r.mode == procv3.ProcessingMode_FULL_DUPLEX_STREAMED && len(r.chunks) > 0 {
		b := recv(t, s).GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
		if b == nil || !b.GetEndOfStream() {
			t.Fatalf("full duplex: got body answer %v, want the whole body back", b)
		}
		ex.sentBody = b.GetBody()
	}
	return true
}

// forward calls the engine at the picked endpoint and streams its
// response through the picker, as Envoy does: down the destination list
// in order until an endpoint accepts the connection (Envoy's retry on
// connect-failure over GIE's endpoint list), reporting the one that
// served in the response headers' envoy.lb metadata.
func (f *fixture) forward(t *testing.T, s extprocv3.ExternalProcessor_ProcessClient, r req, ex *exchange) {
	t.Helper()
	var resp *http.Response
	for ep := range strings.SplitSeq(ex.list, ",") {
		hreq, err := http.NewRequest(http.MethodPost, "http://"+ep+r.path, bytes.NewReader(ex.sentBody))
		if err != nil {
			t.Fatal(err)
		}
		hreq.Header.Set("Content-Type", "application/json")
		if resp, err = http.DefaultClient.Do(hreq); err == nil {
			ex.served = ep
			break
		}
		var op *net.OpError
		if !errors.As(err, &op) || op.Op != "dial" {
			t.Fatal(err)
		}
	}
	if resp == nil {
		t.Fatalf("no endpoint of %q reachable", ex.list)
	}
	defer resp.Body.Close()
	ex.status = resp.StatusCode
	md, err := structpb.NewStruct(map[string]any{ServedKey: ex.served})
	if err != nil {
		t.Fatal(err)
	}
	send(t, s, &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(":status", strconv.Itoa(resp.StatusCode), "content-type", resp.Header.Get("Content-Type"))}},
		MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{DefaultNamespace: md}},
	})
	ex.respHeaders = map[string]string{}
	mut := recv(t, s).GetResponseHeaders().GetResponse().GetHeaderMutation()
	ex.respRemove = mut.GetRemoveHeaders()
	for _, h := range mut.GetSetHeaders() {
		ex.respHeaders[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
	}
	buf := make([]byte, 512) // small chunks: several body messages per response
	for {
		n, err := resp.Body.Read(buf)
		end := err == io.EOF
		if err != nil && !end {
			t.Fatal(err)
		}
		if n == 0 && !end {
			continue
		}
		send(t, s, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{
			Body: append([]byte(nil), buf[:n]...), EndOfStream: end}}})
		got := recv(t, s).GetResponseBody()
		if got == nil {
			t.Fatal("no answer to a response body chunk")
		}
		if sr := got.GetResponse().GetBodyMutation().GetStreamedResponse(); sr != nil {
			ex.respBody = append(ex.respBody, sr.GetBody()...)
		} else {
			ex.respBody = append(ex.respBody, buf[:n]...)
		}
		if end {
			break
		}
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != io.EOF {
		t.Errorf("after the response: got %v, want the picker to end the stream", err)
	}
}

func send(t *testing.T, s extprocv3.ExternalProcessor_ProcessClient, m *extprocv3.ProcessingRequest) {
	t.Helper()
	if err := s.Send(m); err != nil {
		t.Fatalf("send %T: %v", m.GetRequest(), err)
	}
}

func recv(t *testing.T, s extprocv3.ExternalProcessor_ProcessClient) *extprocv3.ProcessingResponse {
	t.Helper()
	m, err := s.Recv()
	if err != nil {
		t.Fatalf("recv: %v", err)
	}
	return m
}

// metric returns the value of the counter or gauge name with the label
// pairs, summed over matching series.
func (f *fixture) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				total += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				total += m.GetGauge().GetValue()
			}
		}
	}
	return total
}

// words is deterministic text of n words, distinct per seed.
func words(seed, n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "w%d_%d ", seed, (i*7919+seed)%1000)
	}
	return b.String()
}

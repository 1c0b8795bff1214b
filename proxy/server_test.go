package proxy

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/wait"
	"github.com/kvrouter/kvrouter/prefix"
)

// serveLimited runs a Router in front of backends on a real listener with
// the server of NewServer, and its admin surface, and returns it and the
// URLs of both.
func serveLimited(t *testing.T, mod func(*Config), backends ...string) (rt *Router, url, admin string) {
	t.Helper()
	rt = newTestRouter(t, "round-robin", mod, backends...)
	adm := httptest.NewServer(rt.AdminHandler())
	t.Cleanup(adm.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := rt.NewServer()
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return rt, "http://" + ln.Addr().String(), adm.URL
}

// metricValue reads the first sample of name, in the Prometheus text at
// url's /metrics, whose labels include labels (name, value pairs); zero
// when absent.
func metricValue(t *testing.T, url, name string, labels ...string) float64 {
	t.Helper()
	for _, m := range families(t, url)[name].GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		ok := true
		for i := 0; i+1 < len(labels); i += 2 {
			ok = ok && have[labels[i]] == labels[i+1]
		}
		if ok {
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return 0
}

// errorCode returns the OpenAI error code of body, or "".
func errorCode(body string) string {
	var e apiError
	json.Unmarshal([]byte(body), &e)
	s, _ := e.Error.Code.(string)
	return s
}

func TestParseLimitsAnswered(t *testing.T) {
	up := newFake(t, 0)
	_, url, admin := serveLimited(t, func(c *Config) {
		c.BodyLimits = prefix.Limits{Messages: 2, Parts: 2, Depth: 8, Tools: 1, Prompts: 2}
	}, up.URL)
	tests := []struct{ name, body, code string }{
		{"messages", `{"model":"m","messages":[{},{},{}]}`, "too_many_messages"},
		{"parts", `{"model":"m","messages":[{"role":"user","content":[{},{},{}]}]}`, "too_many_content_parts"},
		{"depth", `{"model":"m","messages":[{"role":"user","content":"x","x":[[[[[[[[1]]]]]]]]}]}`, "nesting_too_deep"},
		{"tools", `{"model":"m","tools":[{},{}],"messages":[{"role":"user","content":"x"}]}`, "too_many_tools"},
		{"prompts", `{"model":"m","prompt":["a","b","c"]}`, "too_many_prompts"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(t, "POST", url+"/v1/chat/completions", tc.body)
			if resp.StatusCode != http.StatusBadRequest || errorCode(body) != tc.code {
				t.Fatalf("got %d %s, want 400 with code %s", resp.StatusCode, body, tc.code)
			}
			if got := metricValue(t, admin, "kvrouter_errors_total", "code", tc.code); got != 1 {
				t.Errorf("kvrouter_errors_total{code=%q} = %v, want 1", tc.code, got)
			}
		})
	}
	if n := len(up.received()); n != 0 {
		t.Errorf("the replica got %d requests, want 0", n)
	}
	// Within the limits, the same shapes are routed.
	resp, body := do(t, "POST", url+"/v1/chat/completions", `{"model":"m","tools":[{}],"messages":[{"role":"user","content":[{"type":"text","text":"a"},{}]},{}]}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("within limits: got %d %s, want 200", resp.StatusCode, body)
	}
}

// rawRequest writes req on a new connection to url's host and returns the
// connection and a reader of it.
func rawRequest(t *testing.T, url, req string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	return c, bufio.NewReader(c)
}

func TestHeaderLimits(t *testing.T) {
	up := newFake(t, 0)
	_, url, admin := serveLimited(t, func(c *Config) { c.MaxHeaderBytes, c.MaxHeaders = 128<<10, 50 }, up.URL)

	// 10,000 header fields, within the byte limit: 431 too_many_headers.
	var h strings.Builder
	for range 10000 {
		h.WriteString("A: b\r\n")
	}
	c, br := rawRequest(t, url, "GET /v1/models HTTP/1.1\r\nHost: x\r\n"+h.String()+"\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || errorCode(string(b)) != "too_many_headers" {
		t.Errorf("10,000 headers: got %d %s, want 431 too_many_headers", resp.StatusCode, b)
	}
	c.Close()
	if got := metricValue(t, admin, "kvrouter_errors_total", "code", "too_many_headers"); got != 1 {
		t.Errorf("kvrouter_errors_total{code=too_many_headers} = %v, want 1", got)
	}

	// A 1 MiB header: 431 from the server, counted.
	_, br = rawRequest(t, url, "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("x", 1<<20)+"\r\n\r\n")
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("1 MiB header: got %d, want 431", resp.StatusCode)
	}
	wait.For(t, "the 1 MiB header counted", func() bool {
		return metricValue(t, admin, "kvrouter_header_rejected_total") == 1
	})
	if n := len(up.received()); n != 0 {
		t.Errorf("the replica got %d requests, want 0", n)
	}
}

// slowUpstream streams n chunks, one every gap.
func slowUpstream(t *testing.T, n int, gap time.Duration) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			fmt.Fprint(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
			return
		}
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for range n {
			io.WriteString(w, chunk1)
			w.(http.Flusher).Flush()
			time.Sleep(gap) // a slow replica is the behaviour under test
		}
		io.WriteString(w, done)
	}))
	t.Cleanup(s.Close)
	return s
}

func TestBodyTimeout(t *testing.T) {
	up := slowUpstream(t, 6, 100*time.Millisecond)
	_, url, admin := serveLimited(t, func(c *Config) { c.BodyTimeout = 300 * time.Millisecond }, up.URL)

	// A body that does not arrive: 408 body_timeout, connection closed.
	start := time.Now()
	c, br := rawRequest(t, url, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 8000000\r\n\r\n{\"model\":")
	c.SetDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || errorCode(string(b)) != "body_timeout" {
		t.Errorf("slow body: got %d %s, want 408 body_timeout", resp.StatusCode, b)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("answered after %v, want about 300ms", d)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Errorf("after 408: read %v, want EOF (connection closed)", err)
	}
	if got := metricValue(t, admin, "kvrouter_errors_total", "code", "body_timeout"); got != 1 {
		t.Errorf("kvrouter_errors_total{code=body_timeout} = %v, want 1", got)
	}

	// A stream that lasts longer than the body timeout is not cut.
	resp2, body := do(t, "POST", url+"/v1/chat/completions", streamReq)
	if resp2.StatusCode != http.StatusOK || !strings.HasSuffix(body, done) || strings.Count(body, "data: ") != 7 {
		t.Errorf("600 ms stream under a 300 ms body timeout: got %d %q, want 6 chunks and [DONE]", resp2.StatusCode, body)
	}
}

func TestIdleTimeout(t *testing.T) {
	up := newFake(t, 0)
	_, url, _ := serveLimited(t, func(c *Config) { c.IdleTimeout = 200 * time.Millisecond }, up.URL)
	c, br := rawRequest(t, url, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
	c.SetDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	start := time.Now()
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("idle keep-alive connection: read %v, want EOF", err)
	}
	if d := time.Since(start); d < 150*time.Millisecond || d > 2*time.Second {
		t.Errorf("closed after %v idle, want about 200ms", d)
	}
}

// headerEcho is a replica that records the headers of the completions it
// gets.
type headerEcho struct {
	*httptest.Server
	mu   sync.Mutex
	last http.Header
}

func newHeaderEcho(t *testing.T) *headerEcho {
	e := &headerEcho{}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			fmt.Fprint(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
			return
		}
		e.mu.Lock()
		e.last = r.Header.Clone()
		e.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[]}`)
	}))
	t.Cleanup(e.Close)
	return e
}

// TestForwardedHeaders: a trusted proxy's X-Forwarded-* pass on; from
// any other peer they are the router's own, and no X-Forwarded-Host
// carries the Host the client chose.
func TestForwardedHeaders(t *testing.T) {
	spoof := []string{"X-Forwarded-For", "1.2.3.4", "X-Real-IP", "1.2.3.4", "X-Forwarded-Host", "evil.example",
		"X-Forwarded-Proto", "https", "X-Forwarded-Port", "1"}
	tests := []struct {
		name    string
		trusted string
		want    map[string]string // "" means absent
	}{
		{"untrusted peer", "", map[string]string{"X-Forwarded-For": "127.0.0.1", "X-Real-Ip": "",
			"X-Forwarded-Host": "", "X-Forwarded-Proto": "http", "X-Forwarded-Port": ""}},
		{"other network trusted", "10.0.0.0/8", map[string]string{"X-Forwarded-For": "127.0.0.1", "X-Real-Ip": "", "X-Forwarded-Host": ""}},
		{"trusted proxy", "10.0.0.0/8, 127.0.0.1", map[string]string{"X-Forwarded-For": "1.2.3.4, 127.0.0.1", "X-Real-Ip": "1.2.3.4",
			"X-Forwarded-Host": "evil.example", "X-Forwarded-Proto": "https", "X-Forwarded-Port": "1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			up := newHeaderEcho(t)
			_, url, _ := serveLimited(t, func(c *Config) {
				if err := c.TrustedProxies.Set(tc.trusted); err != nil {
					t.Fatal(err)
				}
			}, up.URL)
			resp, body := do(t, "POST", url+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, spoof...)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("got %d %s", resp.StatusCode, body)
			}
			up.mu.Lock()
			got := up.last
			up.mu.Unlock()
			for k, want := range tc.want {
				if v := strings.Join(got.Values(k), ", "); v != want && !(k == "X-Forwarded-Host" && strings.HasPrefix(v, want+":")) {
					t.Errorf("%s: got %q, want %q", k, v, want)
				}
			}
		})
	}
}

func TestLongSessionIDHashed(t *testing.T) {
	up := newFake(t, 0)
	// With ids shown, the records show the session id as the router keeps it.
	rt, url, _ := serveLimited(t, func(c *Config) { c.DebugShowIDs = true }, up.URL)
	long := strings.Repeat("u", 100<<10)
	for _, req := range []struct{ body, header string }{
		{`{"model":"m","user":"` + long + `","messages":[{"role":"user","content":"x"}]}`, ""},
		{`{"model":"m","messages":[{"role":"user","content":"x"}]}`, long[:60<<10]},
	} {
		var hdr []string
		if req.header != "" {
			hdr = []string{"X-Session-ID", req.header}
		}
		if resp, body := do(t, "POST", url+"/v1/chat/completions", req.body, hdr...); resp.StatusCode != http.StatusOK {
			t.Fatalf("got %d %s", resp.StatusCode, body)
		}
	}
	for _, rec := range rt.Decisions(10) {
		if len(rec.Session) > 64 || !strings.HasPrefix(rec.Session, "sha256:") {
			t.Errorf("record keeps session %.80q (%d bytes), want its hash", rec.Session, len(rec.Session))
		}
	}
}

func TestReadGrowing(t *testing.T) {
	tests := []struct {
		name           string
		body, declared int64
		maxCap         int
	}{
		{"declares 8 MB, sends 1 KB", 1 << 10, 8 << 20, 4 << 10},
		{"sends what it declares", 3<<20 + 5, 3<<20 + 5, 3<<20 + 6},
		{"declares nothing", 3 << 20, -1, 4 << 20},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := io.LimitReader(strings.NewReader(strings.Repeat("x", int(tc.body))), tc.body)
			b, err := readGrowing(r, nil, tc.declared)
			if err != nil || int64(len(b)) != tc.body {
				t.Fatalf("read %d bytes, %v; want %d", len(b), err, tc.body)
			}
			if cap(b) > tc.maxCap {
				t.Errorf("buffer of %d bytes for a body of %d, want at most %d", cap(b), tc.body, tc.maxCap)
			}
		})
	}
}

func TestPrefixes(t *testing.T) {
	var ps Prefixes
	if err := ps.Set("10.0.0.0/8, 192.168.1.7,::1"); err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[string]bool{"10.1.2.3": true, "::ffff:10.1.2.3": true, "192.168.1.7": true,
		"192.168.1.8": false, "::1": true, "11.0.0.1": false} {
		if got := ps.Contains(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Contains(%s) = %v, want %v", addr, got, want)
		}
	}
	if got := ps.String(); got != "10.0.0.0/8,192.168.1.7/32,::1/128" {
		t.Errorf("String() = %q", got)
	}
	if err := ps.Set("10.0.0.0/33"); err == nil {
		t.Error("Set(10.0.0.0/33): no error")
	}
	for _, doc := range []string{"trusted-proxies: [10.0.0.0/8, 192.168.1.7]\n", "trusted-proxies: 10.0.0.0/8,192.168.1.7\n"} {
		path := t.TempDir() + "/c.yaml"
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := DefaultConfig()
		if err := ReadConfigFile(path, &cfg); err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		if got := cfg.TrustedProxies.String(); got != "10.0.0.0/8,192.168.1.7/32" {
			t.Errorf("%q: got %q", doc, got)
		}
	}
}

// TestHTTP2HeaderBlockBounded: over HTTP/2 (TLS), a client that starts a
// request's HEADERS and never ends the block loses its connection at the
// header timeout (here 300 ms), not the 90 s idle timeout; requests over
// HTTP/2 are served as over HTTP/1.
func TestHTTP2HeaderBlockBounded(t *testing.T) {
	up := newFake(t, 0)
	rt := newTestRouter(t, "round-robin", func(c *Config) { c.ReadHeaderTimeout = 300 * time.Millisecond }, up.URL)
	srv := httptest.NewUnstartedServer(nil)
	srv.Config = rt.NewServer()
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)

	resp, err := srv.Client().Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"x"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
		t.Fatalf("a request over HTTP/2: %s %s, want 200 over HTTP/2", resp.Proto, resp.Status)
	}

	c, err := tls.Dial("tcp", srv.Listener.Addr().String(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if p := c.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("negotiated %q, want h2", p)
	}
	frame := func(typ, flags byte, stream uint32, payload []byte) []byte {
		b := []byte{byte(len(payload) >> 16), byte(len(payload) >> 8), byte(len(payload)), typ, flags}
		return append(binary.BigEndian.AppendUint32(b, stream), payload...)
	}
	out := []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
	out = append(out, frame(0x4, 0, 0, nil)...)            // SETTINGS
	out = append(out, frame(0x1, 0x1, 1, []byte{0x83})...) // HEADERS, END_STREAM, no END_HEADERS: ":method POST", and never the rest
	start := time.Now()
	if _, err := c.Write(out); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(60 * time.Second))
	_, err = io.Copy(io.Discard, c)
	if took := time.Since(start); err != nil || took > 20*time.Second {
		t.Errorf("connection with an unfinished header block: %v after %v; want it closed near the 300ms header timeout", err, took)
	}
}

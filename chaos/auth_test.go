package chaos

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/wait"
)

// relay is a TCP relay on loopback in front of an engine, optionally
// terminating TLS: it keeps the bytes that went to the engine, so a test
// can tell which requests the engine received.
type relay struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	sent   []byte // toward the engine, capped at 16 MiB
	wg     sync.WaitGroup
}

// startRelay relays to target (host:port); tlsCfg non-nil serves TLS.
func startRelay(t *testing.T, target string, tlsCfg *tls.Config) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
	}
	r := &relay{ln: ln, target: target}
	r.wg.Go(r.accept)
	t.Cleanup(func() { ln.Close(); r.wg.Wait() })
	return r
}

func (r *relay) accept() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		r.wg.Go(func() { r.pipe(c) })
	}
}

func (r *relay) pipe(c net.Conn) {
	defer c.Close()
	up, err := net.DialTimeout("tcp", r.target, 3*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{})
	go func() { io.Copy(c, up); c.Close(); close(done) }()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			r.mu.Lock()
			if len(r.sent) < 16<<20 {
				r.sent = append(r.sent, buf[:n]...)
			}
			r.mu.Unlock()
			if _, werr := up.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	up.Close()
	<-done
}

// requestLine matches a request line. Not anchored at a line start: on a
// kept-alive connection a request follows the previous one's body, which
// need not end in a newline.
var requestLine = regexp.MustCompile(`\b([A-Z]+) (/\S*) HTTP/1\.[01]\r\n`)

// requests returns the request lines ("POST /tokenize") the engine got.
func (r *relay) requests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, m := range requestLine.FindAllSubmatch(r.sent, -1) {
		out = append(out, string(m[1])+" "+string(m[2]))
	}
	return out
}

// got reports how many requests for path the engine received.
func (r *relay) got(path string) int {
	n := 0
	for _, l := range r.requests() {
		if _, p, _ := strings.Cut(l, " "); p == path {
			n++
		}
	}
	return n
}

// writeFile writes s to a new file in dir and returns its path.
func writeFile(t *testing.T, dir, name, s string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// call sends method path with the Authorization header auth (none when
// empty) and returns the status and body.
func call(t *testing.T, client *http.Client, method, url, auth, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// errorCode returns the code of an OpenAI error body, or "".
func errorCode(body string) string {
	var e struct{ Error struct{ Code string } }
	json.Unmarshal([]byte(body), &e)
	return e.Error.Code
}

// TestAuthAndSurface, on real processes: API keys (401 JSON without or
// with a wrong one, 200 with one), the admin surface apart and behind its
// own key, hashed ids in /debug/decisions, engine admin paths not
// forwarded (the relay in front of the engine never carries them), and
// the failures counted in /metrics.
func TestAuthAndSurface(t *testing.T) {
	t.Parallel()
	engine := startEngine(t, "--time-scale", "0.01")
	rl := startRelay(t, engine.addr, nil)
	dir := t.TempDir()
	const key, adminKey = "sk-chaos-5b1e0f7d2c9a4e38", "adm-chaos-91c4e2b7a0d3f568"
	adminAddr := freeAddr(t)
	rt := start(t, "serve", "--health-interval", "100ms", "--backend", "http://"+rl.ln.Addr().String(),
		"--api-keys", writeFile(t, dir, "keys", "# clients\n"+key+" chaos\n"),
		"--admin-api-keys", writeFile(t, dir, "admin-keys", adminKey+"\n"),
		"--admin-listen", adminAddr)
	api, admin := rt.URL(), "http://"+adminAddr
	waitReady(t, api, "/readyz", 10*time.Second)
	c := http.DefaultClient
	body := string(chat("hello", 4, false))

	for _, auth := range []string{"", "Bearer sk-chaos-wrong", "Bearer " + adminKey} {
		status, out := call(t, c, "POST", api+"/v1/chat/completions", auth, body)
		if status != 401 || errorCode(out) != "invalid_api_key" {
			t.Errorf("Authorization %q: status %d %s; want 401 invalid_api_key", auth, status, out)
		}
	}
	user := `{"model":"emulated","user":"alice@example.com","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`
	if status, out := call(t, c, "POST", api+"/v1/chat/completions", "Bearer "+key, user); status != 200 {
		t.Errorf("the right key: status %d %s, want 200", status, out)
	}
	for _, p := range []string{"/metrics", "/ui/", "/debug/decisions"} {
		if status, out := call(t, c, "GET", api+p, "Bearer "+key, ""); status != 404 || errorCode(out) != "unknown_url" {
			t.Errorf("API GET %s: status %d %s; want a JSON 404 (admin paths are not on the API port)", p, status, out)
		}
		if status, _ := call(t, c, "GET", admin+p, "", ""); status != 401 {
			t.Errorf("admin GET %s without its key: status %d, want 401", p, status)
		}
		if status, _ := call(t, c, "GET", admin+p, "Bearer "+adminKey, ""); status != 200 {
			t.Errorf("admin GET %s: status %d, want 200", p, status)
		}
	}
	_, dec := call(t, c, "GET", admin+"/debug/decisions", "Bearer "+adminKey, "")
	if strings.Contains(dec, "alice@example.com") || !strings.Contains(dec, `"session": "h:`) {
		t.Errorf("/debug/decisions shows the user value or no hash:\n%s", dec)
	}

	blocked := []string{"/sleep", "/collective_rpc", "/v1/load_lora_adapter", "/reset_prefix_cache"}
	for _, p := range blocked {
		if status, out := call(t, c, "POST", api+p, "Bearer "+key, "{}"); status != 404 || errorCode(out) != "unknown_url" {
			t.Errorf("POST %s: status %d %s; want a JSON 404", p, status, out)
		}
	}
	if status, out := call(t, c, "POST", api+"/tokenize", "Bearer "+key, `{"model":"emulated","prompt":"hi"}`); status != 200 {
		t.Errorf("POST /tokenize (allowed): status %d %s, want 200", status, out)
	}
	for _, p := range blocked {
		if n := rl.got(p); n != 0 {
			t.Errorf("the engine received %s %d times, want 0", p, n)
		}
	}
	if rl.got("/tokenize") != 1 || rl.got("/v1/chat/completions") != 1 {
		t.Errorf("the engine received /tokenize %d and completions %d times, want 1 and 1 (requests: %v)",
			rl.got("/tokenize"), rl.got("/v1/chat/completions"), rl.requests())
	}
	_, metrics := call(t, c, "GET", admin+"/metrics", "Bearer "+adminKey, "")
	for _, want := range []string{`kvrouter_errors_total{code="invalid_api_key"} 3`, `kvrouter_errors_total{code="unknown_url"} 7`,
		`kvrouter_admin_errors_total{code="invalid_api_key"} 3`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestTLS: the router serves HTTPS with --tls-cert/--tls-key, and reaches
// an https:// backend it verifies with --backend-ca.
func TestTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	certFile, keyFile, pool, cert := selfSigned(t, dir)
	engine := startEngine(t, "--time-scale", "0.01")
	rl := startRelay(t, engine.addr, &tls.Config{Certificates: []tls.Certificate{cert}})
	rt := start(t, "serve", "--health-interval", "100ms", "--backend", "https://"+rl.ln.Addr().String(),
		"--backend-ca", certFile, "--tls-cert", certFile, "--tls-key", keyFile, "--admin-listen", "")
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 10 * time.Second}
	api := "https://" + rt.addr
	wait.For(t, "https /readyz 200", func() bool { status, _ := call(t, client, "GET", api+"/readyz", "", ""); return status == 200 })
	status, out := call(t, client, "POST", api+"/v1/chat/completions", "", string(chat("hello over tls", 4, true)))
	if status != 200 || !strings.Contains(out, "data: [DONE]") {
		t.Errorf("https completion: status %d %q; want 200 to [DONE]", status, out)
	}
	if rl.got("/v1/chat/completions") != 1 {
		t.Errorf("the https backend received %d completions, want 1", rl.got("/v1/chat/completions"))
	}
	resp, err := http.Get("http://" + rt.addr + "/readyz")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Error("plain HTTP answered 200 on the TLS listener")
		}
	}
}

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key
// to dir, and returns their paths, a pool trusting it and the pair.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool, pair tls.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kvrouter chaos"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
	certFile, keyFile = writeFile(t, dir, "cert.pem", string(certPEM)), writeFile(t, dir, "key.pem", string(keyPEM))
	pool = x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	pair, err = tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, pool, pair
}

// Package kubeserver starts a real kube-apiserver, on a real etcd, for
// tests: the binaries internal/apiserver/build.sh builds from the Go
// module proxy into .cache/kube/ (.ci/run builds them before go test).
// Without them a test skips, except under CI=true, where it fails.
//
// The server listens on loopback with its own self-signed certificate
// (CAFile), authenticates static tokens (AdminTokenFile, a member of
// system:masters; RouterTokenFile and EPPTokenFile, the service accounts
// kvrouter and kvrouter-epp of namespace llm, with no rights but those a
// test grants) and authorizes with RBAC. The ServiceAccount admission plugin
// is off (no controller manager creates the default account), and there
// is no kubelet: a test sets a pod's status through the status
// subresource itself (SetPodStatus).
package kubeserver

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// EnvBinDir overrides where the binaries are looked for.
const EnvBinDir = "KVROUTER_KUBE_BIN"

// startTimeout bounds etcd's and the API server's start (a loaded CI
// machine takes tens of seconds for the API server's post-start hooks).
const startTimeout = 4 * time.Minute

// Server is a running kube-apiserver and its etcd.
type Server struct {
	// URL is the API server's https base URL on loopback.
	URL string
	// CAFile is the PEM certificate its serving certificate is checked
	// against; the others hold the tokens.
	CAFile, AdminTokenFile, RouterTokenFile, EPPTokenFile string
	// CRDFile is the InferencePool CRD (GIE, the version build.sh pins).
	CRDFile string

	hc *http.Client
}

// BinDir returns the directory of kube-apiserver and etcd: $KVROUTER_KUBE_BIN,
// else .cache/kube at the repository's root.
func BinDir() string {
	if d := os.Getenv(EnvBinDir); d != "" {
		return d
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", ".cache", "kube")
}

// Start starts etcd and kube-apiserver for the test and stops them when
// it ends. Without the binaries it skips the test, or fails it under
// CI=true.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := BinDir()
	for _, b := range []string{"kube-apiserver", "etcd", "inferencepool-crd.yaml"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			msg := fmt.Sprintf("no %s in %s: build them with bash internal/apiserver/build.sh (about 18 CPU-minutes the first time)", b, bin)
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	dir := t.TempDir()
	etcdURL := startEtcd(t, bin, dir)
	s := &Server{CRDFile: filepath.Join(bin, "inferencepool-crd.yaml")}
	s.startAPIServer(t, bin, dir, etcdURL)
	return s
}

// freePort returns a loopback port free now.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// run starts a binary whose output goes to a log file, stopped (SIGTERM,
// then SIGKILL) when the test ends; the log is shown if the test failed.
func run(t testing.TB, name, logFile string, args ...string) {
	t.Helper()
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second): // a bound on a process that ignores SIGINT
			cmd.Process.Kill()
			<-done
		}
		f.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logFile)
			t.Logf("%s's log (last 4 KiB):\n%s", filepath.Base(name), b[max(0, len(b)-4096):])
		}
	})
}

func startEtcd(t testing.TB, bin, dir string) string {
	t.Helper()
	client := "http://127.0.0.1:" + strconv.Itoa(freePort(t))
	peer := "http://127.0.0.1:" + strconv.Itoa(freePort(t))
	run(t, filepath.Join(bin, "etcd"), filepath.Join(dir, "etcd.log"),
		"--name", "test", "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "test="+peer, "--unsafe-no-fsync", "--log-level", "warn")
	poll(t, "etcd", func() bool {
		resp, err := http.Get(client + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return client
}

func (s *Server) startAPIServer(t testing.TB, bin, dir, etcdURL string) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	write(t, filepath.Join(dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
	write(t, filepath.Join(dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	var csv strings.Builder
	for _, u := range []struct {
		file       *string
		name, user string
		groups     string
	}{
		{&s.AdminTokenFile, "admin", "admin", "system:masters"},
		{&s.RouterTokenFile, "router", "system:serviceaccount:llm:kvrouter", "system:serviceaccounts,system:serviceaccounts:llm"},
		{&s.EPPTokenFile, "epp", "system:serviceaccount:llm:kvrouter-epp", "system:serviceaccounts,system:serviceaccounts:llm"},
	} {
		tok := token()
		fmt.Fprintf(&csv, "%s,%s,%s,\"%s\"\n", tok, u.user, u.name, u.groups)
		*u.file = filepath.Join(dir, u.name+".token")
		write(t, *u.file, []byte(tok))
	}
	write(t, filepath.Join(dir, "tokens.csv"), []byte(csv.String()))
	port := freePort(t)
	certs := filepath.Join(dir, "certs")
	run(t, filepath.Join(bin, "kube-apiserver"), filepath.Join(dir, "kube-apiserver.log"),
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", strconv.Itoa(port),
		"--cert-dir", certs,
		"--token-auth-file", filepath.Join(dir, "tokens.csv"),
		"--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.key"),
		"--service-cluster-ip-range", "10.96.0.0/24",
		"--disable-admission-plugins", "ServiceAccount",
		"--enable-priority-and-fairness=false",
		"--endpoint-reconciler-type", "none", // the kubernetes Service's endpoint may not be on loopback
		"--profiling=false", "-v", "0")
	s.URL = "https://127.0.0.1:" + strconv.Itoa(port)
	s.CAFile = filepath.Join(certs, "apiserver.crt")
	poll(t, "kube-apiserver's certificate", func() bool { _, err := os.Stat(s.CAFile); return err == nil })
	pool := x509.NewCertPool()
	ca, _ := os.ReadFile(s.CAFile)
	pool.AppendCertsFromPEM(ca)
	s.hc = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	poll(t, "kube-apiserver ready", func() bool {
		return s.Do(http.MethodGet, "/readyz", "", nil, nil) == nil
	})
}

func token() string {
	b := make([]byte, 16)
	rand.Read(b)
	return fmt.Sprintf("%x", b)
}

func write(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// poll waits for cond, checked every 100 ms, for up to startTimeout.
func poll(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(startTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, startTimeout)
		}
		time.Sleep(100 * time.Millisecond) // polling a process starting up: no event to wait on
	}
}

// Do sends one request as the admin: in (when not nil) as JSON, or as
// the content type given; out (when not nil) decoded from the JSON
// answer. A status outside 2xx is an error with the server's message.
func (s *Server) Do(method, path, contentType string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, s.URL+path, body)
	if err != nil {
		return err
	}
	tok, _ := os.ReadFile(s.AdminTokenFile)
	req.Header.Set("Authorization", "Bearer "+string(tok))
	req.Header.Set("Content-Type", cmp.Or(contentType, "application/json"))
	resp, err := s.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

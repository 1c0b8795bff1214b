package peers

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/redisserver"
)

// writePEM writes one PEM block to dir/name and returns the path.
func writePEM(t *testing.T, dir, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// newCA makes a certificate authority and a server certificate it signs
// for 127.0.0.1, and returns the files: CA, server certificate, server key.
func newCA(t *testing.T) (ca, cert, key string) {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test redis CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srvTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	return writePEM(t, dir, "ca.pem", "CERTIFICATE", caDER), writePEM(t, dir, "redis.pem", "CERTIFICATE", srvDER),
		writePEM(t, dir, "redis.key", "EC PRIVATE KEY", keyDER)
}

// TestRedisTLS: a redis-server serving TLS (Debian's, --tls-port, no
// client certificates asked) with a private CA. A router with a rediss://
// URL and the CA (--redis-ca) shares state; one without the CA refuses
// the server's certificate; a CA file with a redis:// URL is refused.
func TestRedisTLS(t *testing.T) {
	ca, cert, key := newCA(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	redisserver.Start(t, "--tls-port", strconv.Itoa(port), "--tls-cert-file", cert, "--tls-key-file", key,
		"--tls-ca-cert-file", ca, "--tls-auth-clients", "no")
	url := "rediss://127.0.0.1:" + strconv.Itoa(port)
	mk := func(router, caFile string) *Syncer {
		s, err := New(Config{Settings: Settings{URL: url, Router: router, Interval: 20 * time.Millisecond, TTL: 400 * time.Millisecond, CAFile: caFile}}, newFleet(t))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	admitted(t, mk("a", ca), mk("b", ""))
	if _, err := New(Config{Settings: Settings{URL: "redis://127.0.0.1:1", CAFile: ca}}, newFleet(t)); err == nil {
		t.Error("a CA file with a redis:// URL accepted")
	}
}

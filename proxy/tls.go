package proxy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
)

// ServerTLS returns the listeners' TLS configuration from
// Config.TLSCert and Config.TLSKey (TLS 1.2 or later), or nil when they
// are empty: plain HTTP.
func ServerTLS(cfg Config) (*tls.Config, error) {
	if cfg.TLSCert == "" && cfg.TLSKey == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("tls-cert %s, tls-key %s: %w", cfg.TLSCert, cfg.TLSKey, err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// trustBackendCA makes t verify https:// backends against the
// certificate authorities of the PEM file caFile; empty means t keeps
// the system's roots.
func trustBackendCA(t *http.Transport, caFile string) error {
	if caFile == "" {
		return nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return fmt.Errorf("backend-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return errors.New("backend-ca " + caFile + ": no PEM certificate in it")
	}
	if t.TLSClientConfig == nil {
		t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	t.TLSClientConfig.RootCAs = pool
	return nil
}

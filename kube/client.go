// Package kube is the router's Kubernetes API client: just what discovery
// and leader election need, over net/http. It lists and watches a
// collection (pods by label selector, an InferencePool by name) with the
// API server's list/watch protocol (resourceVersion, ADDED / MODIFIED /
// DELETED / BOOKMARK / ERROR events, 410 Gone and a relist, reconnects
// with backoff), and reads and writes one coordination.k8s.io/v1 Lease
// with optimistic concurrency (409 Conflict).
//
// It is written over net/http with minimal JSON types rather than on
// client-go: the router needs three resources and one reflector loop, and
// client-go's informers, scheme and workqueue would triple the binary's
// dependencies for them. The JSON field names are the API's (core/v1 Pod,
// coordination/v1 Lease, inference.networking.k8s.io/v1 InferencePool);
// the tests encode their objects with k8s.io/api's own types.
package kube

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// In-cluster configuration, as every pod with a service account token
// mounted has it.
const (
	ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	EnvServiceHost    = "KUBERNETES_SERVICE_HOST"
	EnvServicePort    = "KUBERNETES_SERVICE_PORT"
)

// Defaults of Config's zero fields.
const (
	// DefaultTimeout bounds one request that is not a watch.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxBodyBytes bounds a list's or an object's body.
	DefaultMaxBodyBytes = 32 << 20
	// DefaultMaxEventBytes bounds one watch event.
	DefaultMaxEventBytes = 4 << 20
)

// Config says how to reach the API server.
type Config struct {
	// Server is the API server's base URL (https://10.0.0.1:443, or a
	// loopback http:// URL in tests). Required.
	Server string
	// TokenFile holds the bearer token, read again for every request
	// (projected tokens rotate); empty sends none.
	TokenFile string
	// CAFile holds the PEM certificates the server's is checked against;
	// empty means the system's roots.
	CAFile string
	// Timeout bounds one request that is not a watch; zero means
	// DefaultTimeout.
	Timeout time.Duration
	// MaxBodyBytes bounds a response body; zero means
	// DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxEventBytes bounds one watch event; zero means
	// DefaultMaxEventBytes.
	MaxEventBytes int
}

// InCluster returns the configuration of a pod: the API server from
// KUBERNETES_SERVICE_HOST and _PORT, the service account's token and CA.
// getenv is os.Getenv outside tests.
func InCluster(getenv func(string) string) (Config, error) {
	host, port := getenv(EnvServiceHost), getenv(EnvServicePort)
	if host == "" || port == "" {
		return Config{}, fmt.Errorf("kube: not in a cluster (%s and %s unset); give the API server's URL", EnvServiceHost, EnvServicePort)
	}
	tok := ServiceAccountDir + "/token"
	if _, err := os.Stat(tok); err != nil {
		return Config{}, fmt.Errorf("kube: no service account token: %w (automountServiceAccountToken: true?)", err)
	}
	return Config{Server: "https://" + net.JoinHostPort(host, port), TokenFile: tok, CAFile: ServiceAccountDir + "/ca.crt"}, nil
}

// Namespace returns the pod's own namespace from its service account, or
// "" outside a cluster.
func Namespace() string {
	b, err := os.ReadFile(ServiceAccountDir + "/namespace")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Client talks to one API server. Create it with New; it is safe for
// concurrent use.
type Client struct {
	cfg  Config
	base *url.URL
	hc   *http.Client // requests; each bounded by cfg.Timeout
	// The clock of Follow's backoff: now reads it, sleep waits d or until
	// ctx is done (false), jitter draws from [0, 1). Tests make it virtual.
	now    func() time.Time
	sleep  func(ctx context.Context, d time.Duration) bool
	jitter func() float64
}

// New checks cfg and returns its client.
func New(cfg Config) (*Client, error) {
	u, err := url.Parse(cfg.Server)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("kube: API server %q: want http(s)://host:port", cfg.Server)
	}
	if cfg.Timeout < 0 || cfg.MaxBodyBytes < 0 || cfg.MaxEventBytes < 0 {
		return nil, errors.New("kube: negative Timeout, MaxBodyBytes or MaxEventBytes")
	}
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.MaxBodyBytes = cmp.Or(cfg.MaxBodyBytes, DefaultMaxBodyBytes)
	cfg.MaxEventBytes = cmp.Or(cfg.MaxEventBytes, DefaultMaxEventBytes)
	tr := &http.Transport{
		Proxy:                 nil, // the API server is reached directly
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   5 * time.Second,
		ResponseHeaderTimeout: cfg.Timeout,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
	}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("kube: CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kube: CA %s: no PEM certificate", cfg.CAFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &Client{cfg: cfg, base: u, hc: &http.Client{Transport: tr}, now: time.Now, sleep: sleep, jitter: rand.Float64}, nil
}

// StatusError is the API server's answer to a failed request: its HTTP
// status and the metav1.Status it carried.
type StatusError struct {
	Code    int    `json:"code"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
	Details struct {
		RetryAfterSeconds int `json:"retryAfterSeconds"`
	} `json:"details"`
	// RetryAfter is how long the server asked to be left alone: its
	// Retry-After header, else the Status's details.retryAfterSeconds;
	// zero when it said nothing.
	RetryAfter time.Duration `json:"-"`
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("kube: %d %s: %s", e.Code, e.Reason, e.Message)
}

// IsStatus reports whether err is the API server's answer with code.
func IsStatus(err error, code int) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Code == code
}

// request builds a request to path (from the API root) with query.
func (c *Client) request(ctx context.Context, method, path string, query url.Values, body []byte) (*http.Request, error) {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "kvrouter")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.cfg.TokenFile != "" {
		tok, err := os.ReadFile(c.cfg.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("kube: token: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	return req, nil
}

// do sends one request (not a watch) and decodes its JSON answer into
// out (nil: discarded). in, when not nil, is sent as the JSON body.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, in, out any) error {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return fmt.Errorf("kube %s %s: %w", method, path, err)
		}
	}
	req, err := c.request(ctx, method, path, query, body)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("kube %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, c.cfg.MaxBodyBytes+1))
	if err != nil {
		return fmt.Errorf("kube %s %s: %w", method, path, err)
	}
	if int64(len(b)) > c.cfg.MaxBodyBytes {
		return fmt.Errorf("kube %s %s: body larger than %d bytes", method, path, c.cfg.MaxBodyBytes)
	}
	if resp.StatusCode/100 != 2 {
		return statusError(resp, b)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("kube %s %s: %w", method, path, err)
	}
	return nil
}

// statusError reads a failed answer's metav1.Status; its HTTP code wins,
// and its Retry-After header over the Status's retryAfterSeconds.
func statusError(resp *http.Response, body []byte) *StatusError {
	se := &StatusError{}
	if json.Unmarshal(body, se) != nil || se.Message == "" {
		se.Message = strings.TrimSpace(string(body[:min(len(body), 256)]))
	}
	se.Code = resp.StatusCode
	if se.Reason == "" {
		se.Reason = http.StatusText(se.Code)
	}
	se.RetryAfter = retryAfter(resp.Header.Get("Retry-After"), time.Now())
	if se.RetryAfter == 0 && se.Details.RetryAfterSeconds > 0 {
		se.RetryAfter = time.Duration(se.Details.RetryAfterSeconds) * time.Second
	}
	return se
}

// retryAfter reads a Retry-After header: seconds (0 is read as 1), or
// an HTTP date (from now); zero when absent, malformed or past.
func retryAfter(h string, now time.Time) time.Duration {
	if h == "" {
		return 0
	}
	if n, err := strconv.ParseInt(h, 10, 64); err == nil {
		return time.Duration(min(max(n, 1), int64(maxRetryAfter/time.Second))) * time.Second
	}
	if t, err := http.ParseTime(h); err == nil && t.After(now) {
		return min(t.Sub(now), maxRetryAfter)
	}
	return 0
}

package health

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"kvrouter/window"
)

// modelsPath is the route every OpenAI-compatible server has, probed when
// a replica has no health route.
const modelsPath = "/v1/models"

// maxDrain is how much of a probe's body is read, so that its connection
// can be reused (a /v1/models list is a few kilobytes).
const maxDrain = 64 << 10

// statusError is a probe answered with a status other than 2xx.
type statusError struct {
	url    string
	code   int
	status string // "503 Service Unavailable"
}

func (e *statusError) Error() string { return fmt.Sprintf("probe %s: status %s", e.url, e.status) }

// noRoute reports whether err says the probed route does not exist (404
// or 405), rather than that the replica is unwell.
func noRoute(err error) bool {
	var se *statusError
	return errors.As(err, &se) && (se.code == http.StatusNotFound || se.code == http.StatusMethodNotAllowed)
}

// tick probes t once and records the result. When the route probed does
// not exist it falls back, in the same tick, to the next one: Path, then
// /v1/models, then none (passive checks only).
func (c *Checker) tick(ctx context.Context, id string, t *target) {
	path, passive := c.route(t)
	if passive {
		c.reinstate(t)
		return
	}
	for {
		url := joinURL(id, path)
		answer, err := c.probe(ctx, url)
		if ctx.Err() != nil {
			return
		}
		if !noRoute(err) {
			c.record(t, answer, err)
			return
		}
		if path == modelsPath {
			note := err.Error() + "; no probe route, passive checks only"
			c.fallBack(t, "", note)
			c.record(t, note, nil) // the replica answered: it is up
			return
		}
		path = modelsPath
		c.fallBack(t, path, fmt.Sprintf("%v; probing %s instead", err, joinURL(id, path)))
	}
}

// route returns the path t is probed at, or passive true if none.
func (c *Checker) route(t *target) (path string, passive bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return c.pathLocked(t), t.passive
}

// pathLocked returns the path t is probed at; t.mu is held.
func (c *Checker) pathLocked(t *target) string {
	switch {
	case t.path != "":
		return t.path
	case c.Path != "":
		return c.Path
	}
	return "/health"
}

// fallBack switches t's probe to path ("" for none) and passes note on.
func (c *Checker) fallBack(t *target, path, note string) {
	t.mu.Lock()
	t.path, t.passive = path, path == ""
	t.mu.Unlock()
	if c.OnFallback != nil {
		c.OnFallback(t.id, note)
	}
}

// record applies one probe's result: err, or nil and the answer, which
// becomes the reason if t comes back.
func (c *Checker) record(t *target, answer string, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err == nil {
		t.probeFails = 0
		if !t.healthy.Load() {
			t.window = window.Sums{} // a fresh start: old failures are forgiven
			c.setLocked(t, true, answer)
		}
		return
	}
	t.probeFails++
	if t.probeFails >= c.failures() && t.healthy.Load() {
		c.setLocked(t, false, fmt.Sprintf("%v (%s)", err, consecutive(t.probeFails)))
	}
}

// consecutive says "1 failure" or "n consecutive failures".
func consecutive(n int) string {
	if n == 1 {
		return "1 failure"
	}
	return fmt.Sprintf("%d consecutive failures", n)
}

// reinstate returns t to service once passive checks have kept it out for
// Window, when it has no probe route that could.
func (c *Checker) reinstate(t *target) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.healthy.Load() || time.Since(t.since) < c.window() {
		return
	}
	t.window = window.Sums{}
	c.setLocked(t, true, fmt.Sprintf("passive: back in service after %v out (no probe route)", c.window()))
}

// probe GETs url once. On success it returns the answer ("probe URL:
// status 200 OK"); otherwise an error, a *statusError for an answer other
// than 2xx.
func (c *Checker) probe(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", fmt.Errorf("probe %s: %w", url, err)
	}
	client := c.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("probe %s: %w", url, err)
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return "", &statusError{url: url, code: resp.StatusCode, status: resp.Status}
	}
	return fmt.Sprintf("probe %s: status %s", url, resp.Status), nil
}

// joinURL appends path to the base URL id.
func joinURL(id, path string) string { return strings.TrimSuffix(id, "/") + path }

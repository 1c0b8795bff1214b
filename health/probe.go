package health

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
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
		answer, body, err := c.probe(ctx, url)
		if ctx.Err() != nil {
			return
		}
		switch {
		case err == nil:
			if !isModels(url) {
				body = nil
			}
			c.succeeded(ctx, t, answer, body)
			return
		case !noRoute(err):
			c.failed(t, err)
			return
		}
		if path == modelsPath {
			note := err.Error() + "; no probe route, passive checks only"
			c.fallBack(t, "", note)
			c.answered(t, note)
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

// failed applies one failed probe: Failures in a row eject t, unless its
// requests outvote them (panic.go).
func (c *Checker) failed(t *target, err error) {
	defer c.reconcile()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.probeFails++
	now := time.Now()
	if t.probeFails < c.failures() || !t.healthy.Load() || c.overruleLocked(t, err, now) {
		return
	}
	c.ejectLocked(t, probeKind(err), fmt.Sprintf("%v (%s)", err, consecutive(t.probeFails)), now)
}

// answered applies an answer from a replica without probe routes (which
// can list no models): it is up, and returns once its ejection time is
// over.
func (c *Checker) answered(t *target, note string) {
	defer c.reconcile()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.probeFails, t.overruled = 0, false
	if !t.healthy.Load() && !time.Now().Before(t.until) {
		c.admitLocked(t, note)
	}
}

// consecutive says "1 failure" or "n consecutive failures".
func consecutive(n int) string {
	if n == 1 {
		return "1 failure"
	}
	return fmt.Sprintf("%d consecutive failures", n)
}

// reinstate returns t to service once its ejection time is over, when it
// has no probe route that could.
func (c *Checker) reinstate(t *target) {
	defer c.reconcile()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.healthy.Load() || time.Now().Before(t.until) {
		return
	}
	c.admitLocked(t, fmt.Sprintf("passive: back in service after %v out (no probe route)", t.until.Sub(t.since).Round(time.Millisecond)))
}

// probe GETs url once. On success it returns the answer ("probe URL:
// status 200 OK") and, for a /v1/models probe, the listing; otherwise an
// error, a *statusError for an answer other than 2xx.
func (c *Checker) probe(ctx context.Context, url string) (string, []byte, error) {
	limit := int64(maxDrain)
	if isModels(url) {
		limit = maxModelsBody
	}
	return c.get(ctx, url, limit)
}

// joinURL appends path to the base URL id.
func joinURL(id, path string) string { return strings.TrimSuffix(id, "/") + path }

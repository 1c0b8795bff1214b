// Package health decides which replicas may get traffic, from active
// /health probes and from failures the proxy reports (passive checks).
//
// A replica turns unhealthy after Failures consecutive failed probes, or
// when the proxy reports at least PassiveFailures failures within Window
// that make up at least FailureRatio of the outcomes reported there. It
// turns healthy again on the next successful probe. Passive outcomes are
// counted in a ring of time buckets: no goroutine or timer per failure.
package health

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"kvrouter/poll"
)

// Defaults for the zero values of Checker's fields.
const (
	DefaultInterval        = time.Second
	DefaultTimeout         = 500 * time.Millisecond
	DefaultFailures        = 2
	DefaultPassiveFailures = 5
	DefaultWindow          = 10 * time.Second
	DefaultFailureRatio    = 0.5
)

// Checker tracks the health of a set of replicas (base URLs). Set the
// exported fields before Run; Add, Remove, ReportFailure and ReportSuccess
// may be called at any time, before or during Run.
type Checker struct {
	// Client does the probes; nil means http.DefaultClient (each probe is
	// bounded by Timeout).
	Client *http.Client
	// Interval is the probing period per replica; zero means 1 s.
	Interval time.Duration
	// Timeout bounds one probe; zero means 500 ms.
	Timeout time.Duration
	// Path is the probe path; empty means "/health". Any 2xx is healthy.
	Path string
	// Failures is the number of consecutive failed probes that make a
	// replica unhealthy; zero means 2.
	Failures int
	// PassiveFailures is the number of reported failures within Window that
	// make a replica unhealthy; zero means 5.
	PassiveFailures int
	// Window is the span over which reported outcomes count; zero means 10 s.
	// It is kept in 10 buckets, so outcomes expire in steps of Window/10.
	Window time.Duration
	// FailureRatio is the least fraction of reported outcomes in Window that
	// must be failures, 0..1; zero means 0.5. It keeps a busy replica with a
	// few failed requests in service.
	FailureRatio float64
	// OnChange, if set, is called on every transition, with the replica's
	// lock held (so calls for one replica are ordered): it must not call
	// back into the Checker for the same replica.
	OnChange func(id string, healthy bool)

	targets poll.Group[*target]
}

// target is one replica's health state.
type target struct {
	id      string
	healthy atomic.Bool

	// mu guards probeFails, window and transitions of healthy.
	mu         sync.Mutex
	probeFails int
	window     window
}

// Add starts tracking id, initially healthy; adding a present id does
// nothing.
func (c *Checker) Add(id string) {
	t := &target{id: id}
	t.healthy.Store(true)
	c.targets.Add(id, t)
}

// Remove stops tracking id; Healthy reports false for it afterwards.
func (c *Checker) Remove(id string) { c.targets.Remove(id) }

// Healthy reports whether id may get traffic; false for an unknown id.
func (c *Checker) Healthy(id string) bool {
	t := c.target(id)
	return t != nil && t.healthy.Load()
}

// ReportFailure records a failed request to id (connect error, 5xx, broken
// stream). Unknown ids are ignored.
func (c *Checker) ReportFailure(id string) { c.report(id, true) }

// ReportSuccess records a successful request to id. It does not by itself
// restore an unhealthy replica (only a probe does), but it dilutes failures
// in the window.
func (c *Checker) ReportSuccess(id string) { c.report(id, false) }

func (c *Checker) report(id string, failed bool) {
	t := c.target(id)
	if t == nil {
		return
	}
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.window.add(now, c.window(), failed)
	if !failed || !t.healthy.Load() {
		return
	}
	fails, total := t.window.sum(now, c.window())
	if fails >= c.passiveFailures() && float64(fails) >= c.failureRatio()*float64(total) {
		c.setLocked(t, false)
	}
}

// Run probes every replica until ctx is done, then waits for the loops to
// stop and returns ctx's error. Run must not be called twice at once.
func (c *Checker) Run(ctx context.Context) error {
	err := c.targets.Run(ctx, poll.Loop[*target]{Period: c.interval(), Do: c.tick})
	if err != nil && err != ctx.Err() {
		return fmt.Errorf("health: %w", err)
	}
	return err
}

func (c *Checker) target(id string) *target {
	t, _ := c.targets.Get(id)
	return t
}

// tick probes t once and records the result.
func (c *Checker) tick(ctx context.Context, id string, t *target) {
	err := c.probe(ctx, id)
	if ctx.Err() != nil {
		return
	}
	c.record(t, err)
}

// record applies one probe result.
func (c *Checker) record(t *target, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err == nil {
		t.probeFails = 0
		if !t.healthy.Load() {
			t.window = window{} // a fresh start: old failures are forgiven
			c.setLocked(t, true)
		}
		return
	}
	t.probeFails++
	if t.probeFails >= c.failures() && t.healthy.Load() {
		c.setLocked(t, false)
	}
}

// setLocked changes t's state and calls OnChange; t.mu is held.
func (c *Checker) setLocked(t *target, healthy bool) {
	t.healthy.Store(healthy)
	if c.OnChange != nil {
		c.OnChange(t.id, healthy)
	}
}

// probe GETs the health path once.
func (c *Checker) probe(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout())
	defer cancel()
	path := c.Path
	if path == "" {
		path = "/health"
	}
	url := strings.TrimSuffix(id, "/") + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("probe %s: %w", url, err)
	}
	client := c.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("probe %s: %w", url, err)
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("probe %s: status %s", url, resp.Status)
	}
	return nil
}

func (c *Checker) interval() time.Duration { return or(c.Interval, DefaultInterval) }
func (c *Checker) timeout() time.Duration  { return or(c.Timeout, DefaultTimeout) }
func (c *Checker) window() time.Duration   { return or(c.Window, DefaultWindow) }
func (c *Checker) failures() int           { return or(c.Failures, DefaultFailures) }
func (c *Checker) passiveFailures() int    { return or(c.PassiveFailures, DefaultPassiveFailures) }
func (c *Checker) failureRatio() float64   { return or(c.FailureRatio, DefaultFailureRatio) }

// or returns v if positive, else def.
func or[T int | float64 | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

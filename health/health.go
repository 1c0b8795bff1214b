// Package health decides which replicas may get traffic, from active
// probes and from failures the proxy reports (passive checks).
//
// A replica turns unhealthy after Failures consecutive failed probes, or
// when the proxy reports at least PassiveFailures failures within Window
// that make up at least FailureRatio of the outcomes reported there. It
// turns healthy again on the next successful probe. Passive outcomes are
// counted in a ring of time buckets: no goroutine or timer per failure.
//
// Probes GET Path (default /health). Many OpenAI-compatible servers have no
// such route: when it answers 404 or 405 the replica is probed at
// /v1/models instead, and when that answers 404 or 405 too it is not
// probed at all. Such a replica is judged by passive checks alone; once
// they eject it, it comes back after Window (as Envoy's outlier detection
// returns a host after its ejection time), since no probe can.
package health

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"kvrouter/poll"
	"kvrouter/window"
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
	// A replica whose Path answers 404 or 405 is probed at "/v1/models"
	// instead (see the package comment).
	Path string
	// Failures is the number of consecutive failed probes that make a
	// replica unhealthy; zero means 2.
	Failures int
	// PassiveFailures is the number of reported failures within Window that
	// make a replica unhealthy; zero means 5.
	PassiveFailures int
	// Window is the span over which reported outcomes count; zero means 10 s.
	// It is kept in 10 buckets, so outcomes expire in steps of Window/10.
	// It is also how long a replica without a probe route stays ejected.
	Window time.Duration
	// FailureRatio is the least fraction of reported outcomes in Window that
	// must be failures, 0..1; zero means 0.5. It keeps a busy replica with a
	// few failed requests in service.
	FailureRatio float64
	// OnChange, if set, is called on every transition, with the replica's
	// lock held (so calls for one replica are ordered): it must not call
	// back into the Checker for the same replica. It is OnTransition
	// without the reason.
	OnChange func(id string, healthy bool)
	// OnTransition, if set, is called on every transition like OnChange
	// (after it, under the same lock), with the reason for it, such as
	// "probe http://h/health: status 503 Service Unavailable (2 consecutive
	// failures)" or "passive: 5 of 6 requests failed in 10s".
	OnTransition func(id string, healthy bool, reason string)
	// OnFallback, if set, is called from the replica's probe loop when its
	// probe route does not exist and the Checker falls back, with a note
	// such as "probe http://h/health: status 404 Not Found; probing
	// http://h/v1/models instead". It is worth a log line.
	OnFallback func(id, note string)

	targets poll.Group[*target]
}

// Status is one replica's health as the Checker sees it.
type Status struct {
	// Healthy reports whether the replica may get traffic.
	Healthy bool
	// Reason says why Healthy last changed; empty if it never has.
	Reason string
	// Since is when Healthy last changed; zero if it never has.
	Since time.Time
	// Probe is the URL the replica is probed at; empty when it has no probe
	// route and is judged by passive checks alone.
	Probe string
}

// target is one replica's health state.
type target struct {
	id      string
	healthy atomic.Bool

	// mu guards the fields below and transitions of healthy.
	mu         sync.Mutex
	probeFails int
	window     window.Sums // request outcomes: failures (A), all (B)
	path       string      // probe path in use; "" before the first probe
	passive    bool        // no probe route: passive checks only
	reason     string      // why healthy last changed
	since      time.Time
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

// Status returns id's health; ok is false for an unknown id.
func (c *Checker) Status(id string) (st Status, ok bool) {
	t := c.target(id)
	if t == nil {
		return Status{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	st = Status{Healthy: t.healthy.Load(), Reason: t.reason, Since: t.since}
	if !t.passive {
		st.Probe = joinURL(id, c.pathLocked(t))
	}
	return st, true
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
	var f int64
	if failed {
		f = 1
	}
	t.window.Add(now, c.window(), f, 1)
	if !failed || !t.healthy.Load() {
		return
	}
	fails, total := t.window.Sum(now, c.window())
	if fails >= int64(c.passiveFailures()) && float64(fails) >= c.failureRatio()*float64(total) {
		c.setLocked(t, false, fmt.Sprintf("passive: %d of %d requests failed in %v", fails, total, c.window()))
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

// setLocked changes t's state and calls the hooks; t.mu is held.
func (c *Checker) setLocked(t *target, healthy bool, reason string) {
	t.healthy.Store(healthy)
	t.reason, t.since = reason, time.Now()
	if c.OnChange != nil {
		c.OnChange(t.id, healthy)
	}
	if c.OnTransition != nil {
		c.OnTransition(t.id, healthy, reason)
	}
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

// Package health decides which replicas may get traffic, from active
// probes and from failures the proxy reports (passive checks).
//
// A replica is ejected (turns unhealthy) after Failures consecutive failed
// probes, after Consecutive consecutive failed requests the proxy reports,
// when the proxy reports at least PassiveFailures failures within Window
// that make up at least FailureRatio of the outcomes reported there, or at
// once when the proxy calls Eject (a refused connection: a replica that
// fails fast must not draw traffic for showing no load). Passive outcomes
// are counted in a ring of time buckets: no goroutine or timer per failure.
//
// An ejection lasts at least EjectBase, doubled for each ejection in a row
// up to EjectMax; the count resets once a replica has stayed in service for
// EjectMax (Envoy's outlier detection, with its base_ejection_time and
// max_ejection_time). Probes go on meanwhile, but only a successful probe
// after the ejection time re-admits a replica, and only if its /v1/models
// lists the models it is expected to serve (Models, else those it listed
// at its first successful probe): another service that took over the
// replica's port answers /health too, but not with the model. A replica
// that answers 500 to every request while its /health says 200 therefore
// comes back for a moment after 1 s, 2 s, 4 s ... 30 s instead of flapping.
//
// Requests outvote probes, and a fleet is never emptied by probes alone
// (panic.go): failed probes do not eject a replica whose requests have
// just succeeded, and while fewer than PanicThreshold of the replicas are
// healthy, those ejected by probes alone are routable again (Envoy's
// healthy_panic_threshold). OnChange reports routability; Healthy the
// evidence.
//
// Probes GET Path (default /health). Many OpenAI-compatible servers have no
// such route: when it answers 404 or 405 the replica is probed at
// /v1/models instead, and when that answers 404 or 405 too it is not
// probed at all. Such a replica is judged by passive checks alone; once
// they eject it, it comes back when its ejection time is over, since no
// probe can.
package health

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvrouter/kvrouter/poll"
	"github.com/kvrouter/kvrouter/window"
)

// Defaults for the zero values of Checker's fields.
const (
	DefaultInterval        = time.Second
	DefaultTimeout         = 500 * time.Millisecond
	DefaultFailures        = 2
	DefaultPassiveFailures = 5
	DefaultWindow          = 10 * time.Second
	DefaultFailureRatio    = 0.5
	DefaultConsecutive     = 5
	DefaultEjectBase       = time.Second
	DefaultEjectMax        = 30 * time.Second
)

// Outlier is the outlier detection of passive checks: when reported
// failures eject a replica, and for how long (Envoy's consecutive_5xx,
// base_ejection_time and max_ejection_time). The YAML keys are kvrouter
// serve's flag names.
type Outlier struct {
	// Consecutive is the number of consecutive reported failures that
	// eject a replica however many successes came before; zero means
	// DefaultConsecutive.
	Consecutive int `yaml:"eject-consecutive"`
	// EjectBase is how long a first ejection lasts at least; each
	// ejection in a row doubles it, up to EjectMax. Zero means
	// DefaultEjectBase.
	EjectBase time.Duration `yaml:"eject-base"`
	// EjectMax caps an ejection's duration, and is how long a replica must
	// stay in service for its ejection count to reset. Zero means
	// DefaultEjectMax.
	EjectMax time.Duration `yaml:"eject-max"`
	// PanicThreshold is the fraction of healthy replicas, 0..1, below
	// which the replicas ejected by probes alone are routed to anyway
	// (panic.go). Zero means DefaultPanicThreshold; negative, never.
	PanicThreshold float64 `yaml:"panic-threshold"`
}

// DefaultOutlier returns the outlier detection that zero values stand
// for.
func DefaultOutlier() Outlier {
	return Outlier{Consecutive: DefaultConsecutive, EjectBase: DefaultEjectBase, EjectMax: DefaultEjectMax, PanicThreshold: DefaultPanicThreshold}
}

// Validate reports the settings that are negative.
func (o Outlier) Validate() error {
	var errs []error
	if o.Consecutive < 0 {
		errs = append(errs, fmt.Errorf("eject-consecutive: must not be negative, got %d", o.Consecutive))
	}
	if o.EjectBase < 0 {
		errs = append(errs, fmt.Errorf("eject-base: must not be negative, got %d", int64(o.EjectBase)))
	}
	if o.EjectMax < 0 {
		errs = append(errs, fmt.Errorf("eject-max: must not be negative, got %d", int64(o.EjectMax)))
	}
	if o.PanicThreshold > 1 {
		errs = append(errs, fmt.Errorf("panic-threshold: must be at most 1, got %v", o.PanicThreshold))
	}
	return errors.Join(errs...)
}

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
	Window time.Duration
	// FailureRatio is the least fraction of reported outcomes in Window that
	// must be failures, 0..1; zero means 0.5. It keeps a busy replica with a
	// few failed requests in service.
	FailureRatio float64
	// Outlier says when reported failures eject a replica, and for how
	// long.
	Outlier
	// Models, if set, returns the model names replica id must list in its
	// /v1/models to be re-admitted after an ejection. Nil, or an empty
	// result, means the ones it listed at its first successful probe (none
	// to check if it never listed any).
	Models func(id string) []string
	// OnEject, if set, is called on every ejection, after OnTransition and
	// under the same lock.
	OnEject func(id string, e Ejection)
	// OnHold, if set, is called from the replica's probe loop when a
	// replica whose ejection time is over is kept out, with the reason
	// (its /v1/models does not list the expected models, or cannot be
	// read); once per distinct reason in a row.
	OnHold func(id, reason string)
	// OnChange, if set, is called when a replica turns routable or not
	// (Routable: healthy, or in panic mode's set), with the replica's lock
	// held (so calls for one replica are ordered): it must not call back
	// into the Checker for the same replica.
	OnChange func(id string, routable bool)
	// OnPanic, if set, is called when panic mode starts (on) or ends,
	// with the healthy replicas and all of them; with no replica's lock
	// held.
	OnPanic func(on bool, healthy, total int)
	// OnOverrule, if set, is called under the replica's lock when failed
	// probes would have ejected a replica whose requests succeed (it is
	// kept), once per run of failed probes, with the reason.
	OnOverrule func(id, reason string)
	// OnTransition, if set, is called on every transition of Healthy
	// (under the replica's lock), with the reason for it, such as
	// "probe http://h/health: status 503 Service Unavailable (2 consecutive
	// failures)" or "passive: 5 of 6 requests failed in 10s".
	OnTransition func(id string, healthy bool, reason string)
	// OnFallback, if set, is called from the replica's probe loop when its
	// probe route does not exist and the Checker falls back, with a note
	// such as "probe http://h/health: status 404 Not Found; probing
	// http://h/v1/models instead". It is worth a log line.
	OnFallback func(id, note string)

	targets poll.Group[*target]
	panic   atomic.Bool // in panic mode (panic.go)
	dirty   atomic.Bool // a transition since the last reconcile
	pmu     sync.Mutex  // serializes reconcile
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
	// Ejections counts the replica's ejections in a row (see EjectMax);
	// zero if none since its count last reset.
	Ejections int
	// Until is when the replica's current ejection time ends; zero if it
	// was never ejected.
	Until time.Time
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
	consec     int       // consecutive reported failures
	ejections  int       // ejections in a row
	until      time.Time // end of the current ejection time
	admitted   time.Time // when the replica last returned to service
	models     []string  // the models it listed at its first successful probe
	learned    bool      // models is settled (listed, or no listing to be had)
	held       string    // the last reason it was kept out, for OnHold
	kind       string    // the kind of its last ejection
	routable   bool      // what OnChange last said (initially true)
	overruled  bool      // requests outvoted the current run of failed probes
	lastOK     time.Time // when a request to it last succeeded
}

// Add starts tracking id, initially healthy; adding a present id does
// nothing.
func (c *Checker) Add(id string) {
	t := &target{id: id, routable: true}
	t.healthy.Store(true)
	if c.targets.Add(id, t) {
		c.dirty.Store(true)
		c.reconcile()
	}
}

// Remove stops tracking id; Healthy reports false for it afterwards.
func (c *Checker) Remove(id string) {
	if _, ok := c.targets.Remove(id); ok {
		c.dirty.Store(true)
		c.reconcile()
	}
}

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
	st = Status{Healthy: t.healthy.Load(), Reason: t.reason, Since: t.since, Ejections: t.ejections, Until: t.until}
	if !t.passive {
		st.Probe = joinURL(id, c.pathLocked(t))
	}
	return st, true
}

// ReportFailure records a failed request to id (connect error, 5xx, broken
// stream, timeout). Unknown ids are ignored.
func (c *Checker) ReportFailure(id string) { c.report(id, true) }

// ReportSuccess records a successful request to id. It does not by itself
// restore an unhealthy replica (only a probe does), but it dilutes failures
// in the window and ends a run of consecutive failures.
func (c *Checker) ReportSuccess(id string) { c.report(id, false) }

func (c *Checker) report(id string, failed bool) {
	t := c.target(id)
	if t == nil {
		return
	}
	now := time.Now()
	defer c.reconcile()
	t.mu.Lock()
	defer t.mu.Unlock()
	var f int64
	if failed {
		f = 1
	}
	t.window.Add(now, c.window(), f, 1)
	if !failed {
		t.consec = 0
		t.lastOK = now
		return
	}
	t.consec++
	if !t.healthy.Load() {
		c.failedInPanicLocked(t, now)
		return
	}
	if reason, ok := c.passiveVerdictLocked(t, now); ok {
		c.ejectLocked(t, KindPassive, reason, now)
	}
}

// passiveVerdictLocked reports whether t's reported outcomes eject it, and
// why: failures in Window past the count and ratio, or in a row; t.mu is
// held.
func (c *Checker) passiveVerdictLocked(t *target, now time.Time) (string, bool) {
	fails, total := t.window.Sum(now, c.window())
	switch {
	case fails >= int64(c.passiveFailures()) && float64(fails) >= c.failureRatio()*float64(total):
		return fmt.Sprintf("passive: %d of %d requests failed in %v", fails, total, c.window()), true
	case t.consec >= c.consecutive():
		return fmt.Sprintf("passive: %d requests in a row failed", t.consec), true
	}
	return "", false
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
	c.dirty.Store(true)
	c.publishLocked(t)
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
func (c *Checker) consecutive() int        { return or(c.Consecutive, DefaultConsecutive) }
func (c *Checker) ejectBase() time.Duration {
	return or(c.EjectBase, DefaultEjectBase)
}
func (c *Checker) ejectMax() time.Duration {
	return max(or(c.EjectMax, DefaultEjectMax), c.ejectBase())
}

// or returns v if positive, else def.
func or[T int | float64 | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

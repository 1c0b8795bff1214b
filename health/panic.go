package health

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// Health from evidence, failing safe. A probe is a proxy for what matters,
// the requests: a replica whose /health is slow (a busy Python event loop,
// a saturated health route) but whose requests succeed must not be taken
// out for it, and a fleet must not be emptied by probes alone. Two rules,
// after Envoy's outlier detection and load balancer:
//
//   - Requests outvote probes. Failed probes do not eject a replica that
//     has had a request succeed within the span of those probes (Failures
//     periods and a Timeout): the probes are overruled (OnOverrule, once a
//     run of failures). A replica whose requests hang has no such success
//     and is ejected as before.
//   - Panic mode (Envoy's healthy_panic_threshold, 50% by default there
//     and here). While fewer than PanicThreshold of the replicas are
//     healthy, the replicas ejected by probes alone, whose requests have
//     not failed since, are routable again: better a slow probe than no
//     fleet. A panic-routable replica whose requests fail (the passive
//     thresholds) or refuse connections, or that probes find replaced by
//     another service, leaves the panic set. Panic ends once enough
//     replicas are healthy again; OnPanic is told both ways.
//
// OnChange reports whether a replica is routable: healthy, or in the
// panic set. Healthy and Status report the evidence alone.

// DefaultPanicThreshold is the fraction of healthy replicas below which
// panic mode routes to the replicas ejected by probes alone: Envoy's
// healthy_panic_threshold default.
const DefaultPanicThreshold = 0.5

// Routable reports whether id may get traffic: healthy, or ejected by
// probes alone while the Checker is in panic mode.
func (c *Checker) Routable(id string) bool {
	t := c.target(id)
	if t == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return c.routableLocked(t)
}

// Panic reports whether the Checker is in panic mode: fewer than
// PanicThreshold of its replicas are healthy.
func (c *Checker) Panic() bool { return c.panic.Load() }

// routableLocked reports whether t may get traffic; t.mu is held.
func (c *Checker) routableLocked(t *target) bool {
	return t.healthy.Load() || (c.panic.Load() && t.kind == KindProbe && t.held == "")
}

// publishLocked tells OnChange when t's routability changed; t.mu is held.
func (c *Checker) publishLocked(t *target) {
	r := c.routableLocked(t)
	if r == t.routable {
		return
	}
	t.routable = r
	if c.OnChange != nil {
		c.OnChange(t.id, r)
	}
}

// reconcile enters or leaves panic mode after transitions (marked by
// dirty), republishing every replica's routability when it does. It is
// called with no target's lock held.
func (c *Checker) reconcile() {
	if !c.dirty.Swap(false) {
		return
	}
	c.pmu.Lock()
	defer c.pmu.Unlock()
	ts := c.targets.Values()
	healthy := 0
	for _, t := range ts {
		if t.healthy.Load() {
			healthy++
		}
	}
	on := len(ts) > 0 && float64(healthy) < c.panicThreshold()*float64(len(ts))
	if on == c.panic.Load() {
		return
	}
	c.panic.Store(on)
	for _, t := range ts {
		t.mu.Lock()
		c.publishLocked(t)
		t.mu.Unlock()
	}
	if c.OnPanic != nil {
		c.OnPanic(on, healthy, len(ts))
	}
}

// overruleLocked reports whether requests outvote t's failed probes: one
// succeeded within the span of the last Failures probes. It tells
// OnOverrule once per run of failed probes; t.mu is held.
func (c *Checker) overruleLocked(t *target, err error, now time.Time) bool {
	span := time.Duration(c.failures())*c.interval() + c.timeout()
	if t.lastOK.IsZero() || now.Sub(t.lastOK) > span {
		return false
	}
	if !t.overruled {
		t.overruled = true
		if c.OnOverrule != nil {
			c.OnOverrule(t.id, fmt.Sprintf("%v (%s), but a request succeeded %v ago: kept in service",
				err, consecutive(t.probeFails), now.Sub(t.lastOK).Round(time.Millisecond)))
		}
	}
	return true
}

// probeKind is the ejection kind of a failed probe: KindConnect when
// nothing listens (the replica is gone: panic mode does not route to it),
// else KindProbe (a slow or unwell answer).
func probeKind(err error) string {
	var op *net.OpError
	if errors.Is(err, syscall.ECONNREFUSED) || (errors.As(err, &op) && op.Op == "dial" && !op.Timeout()) {
		return KindConnect
	}
	return KindProbe
}

// failedInPanicLocked applies a request failure reported for t while it is
// out of service: when t is in the panic set (ejected by probes alone) and
// its failures reach the passive thresholds, it is ejected for them and
// leaves the set; t.mu is held.
func (c *Checker) failedInPanicLocked(t *target, now time.Time) {
	if t.kind != KindProbe {
		return
	}
	if reason, ok := c.passiveVerdictLocked(t, now); ok {
		c.ejectLocked(t, KindPassive, reason+" in panic mode", now)
	}
}

// panicThreshold is PanicThreshold's value: zero means the default, a
// negative value no panic mode.
func (c *Checker) panicThreshold() float64 {
	if c.PanicThreshold < 0 {
		return 0
	}
	return or(c.PanicThreshold, DefaultPanicThreshold)
}

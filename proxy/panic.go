package proxy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Health failing safe (package health's panic.go): the proxy's side. The
// fleet routes on a replica's routability (healthy, or in panic mode's
// set); a request that finds no routable replica waits, up to
// --ttft-timeout, for one to become routable instead of getting 503 at
// once. Each is counted.

// healthMetrics count what failing safe did.
type healthMetrics struct {
	panic       prometheus.Gauge       // 1 in panic mode
	panicRouted prometheus.Counter     // requests sent to a replica routable only in panic mode
	overruled   prometheus.Counter     // runs of failed probes outvoted by successful requests
	holds       *prometheus.CounterVec // result: served, timeout, canceled
	waiting     prometheus.Gauge       // requests held now
}

// registerHealth creates and registers the health metrics.
func (m *metrics) registerHealth(reg prometheus.Registerer) error {
	h := &m.health
	h.panic = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvrouter_health_panic",
		Help: "1 while fewer than --panic-threshold of the replicas are in service and those ejected by failed probes alone, whose requests have not failed since, get traffic anyway (panic mode); else 0.",
	})
	h.panicRouted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvrouter_panic_routed_total",
		Help: "Requests sent to a replica that failed probes ejected, in panic mode.",
	})
	h.overruled = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvrouter_probe_overruled_total",
		Help: "Runs of failed probes that did not eject a replica because a request to it had succeeded within their span.",
	})
	h.holds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_no_replica_holds_total",
		Help: "Requests that found no replica in service and waited, up to --ttft-timeout, for one, by result: served (one came back), timeout (answered 503), canceled (the client left).",
	}, []string{"result"})
	h.waiting = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvrouter_no_replica_waiting",
		Help: "Requests waiting now for a replica to come into service (see kvrouter_no_replica_holds_total).",
	})
	for _, r := range []string{"served", "timeout", "canceled"} {
		h.holds.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{h.panic, h.panicRouted, h.overruled, h.holds, h.waiting} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// onRoutable tells the fleet whether replica id may get traffic and, when
// it may, wakes the requests and retries waiting for one.
func (st *state) onRoutable(id string, routable bool) {
	st.fleet.SetHealthy(id, routable)
	if routable {
		ch := make(chan struct{})
		close(*st.back.Swap(&ch))
	}
}

// onPanic logs and shows panic mode's start and end.
func (st *state) onPanic(on bool, healthy, total int) {
	if on {
		st.log.Warn("health panic mode: too few replicas in service; routing to those ejected by probes alone while their requests succeed",
			"in_service", healthy, "replicas", total)
	} else {
		st.log.Info("health panic mode over", "in_service", healthy, "replicas", total)
	}
	if st.m == nil {
		return
	}
	if on {
		st.m.health.panic.Set(1)
	} else {
		st.m.health.panic.Set(0)
	}
}

// onOverrule logs and counts failed probes that requests outvoted.
func (st *state) onOverrule(id, reason string) {
	st.log.Warn("replica kept in service", "replica", id, "reason", reason)
	if st.m != nil {
		st.m.health.overruled.Inc()
	}
}

// holdForReplica is the decision of a call that found no replica in
// service: it waits for one to become routable and decides again, up to
// --ttft-timeout from t0 (zero: no wait), or until the client leaves. It
// returns when the call was decided last, counting the result.
func (c *call) holdForReplica(t0 time.Time) time.Time {
	rt := c.rt
	d := rt.cfg.TTFTTimeout
	if d <= 0 {
		return t0
	}
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	rt.m.health.waiting.Inc()
	defer rt.m.health.waiting.Dec()
	result := "served"
	for c.ticket == nil {
		back := rt.st.backSignal()
		if t0 = c.decideNow(); c.ticket != nil {
			break
		}
		select {
		case <-back:
			continue
		case <-deadline.C:
			result = "timeout"
		case <-c.ctx.Done():
			result = "canceled"
		}
		break
	}
	rt.m.health.holds.WithLabelValues(result).Inc()
	return t0
}

// countPanic counts a call sent, in panic mode, to a replica that failed
// probes ejected.
func (c *call) countPanic() {
	h := c.rt.st.health
	if h.Panic() && !h.Healthy(c.rt.name(c.replica)) {
		c.rt.m.health.panicRouted.Inc()
	}
}

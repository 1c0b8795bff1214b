package proxy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/route"
)

// metrics are the router's own instruments, registered on the Registerer
// given to New (no global registry).
type metrics struct {
	requests  *prometheus.CounterVec   // replica, policy, reason
	errors    *prometheus.CounterVec   // code
	retries   *prometheus.CounterVec   // replica (the one that failed)
	ttft      *prometheus.HistogramVec // replica, model: routed requests answered ok
	e2e       *prometheus.HistogramVec // replica, model: routed requests answered ok
	predicted *prometheus.CounterVec   // replica
	actual    *prometheus.CounterVec   // replica
	prompt    *prometheus.CounterVec   // replica
	decide    prometheus.Histogram

	// Outcomes (issue 15): every completion request and every
	// pass-through call, by how it ended; the model label is bounded by
	// models.
	completions *prometheus.CounterVec   // endpoint, model, outcome, code
	pass        *prometheus.CounterVec   // prefix, outcome, code
	passDur     *prometheus.HistogramVec // prefix
	models      modelLabels

	// Safety surface (issue 13).
	adminErrors *prometheus.CounterVec // code: the admin surface's errors
	draining    prometheus.Gauge       // 1 from SIGTERM on

	// Limits (issue 13). Requests the handlers reject for a limit are
	// counted in errors by their code (too_many_messages, body_timeout,
	// too_many_headers, request_too_large, ...); these are the
	// rejections no handler sees.
	headerRejected prometheus.Counter

	// Upstream safety.
	timeouts   *prometheus.CounterVec // kind: connect, ttft, idle, total, probe
	midstream  *prometheus.CounterVec // result: continued, error
	ejections  *prometheus.CounterVec // replica, kind
	readmitted *prometheus.CounterVec // replica
	stallHolds prometheus.Counter     // attempts held on an ejected replica: no other in service
	health     healthMetrics          // panic mode, outvoted probes, requests held (panic.go)

	guardMetrics // guardmetrics.go
}

// latencyBuckets span 1 ms to ~65 s.
var latencyBuckets = prometheus.ExponentialBuckets(0.001, 2, 17)

func newMetrics(reg prometheus.Registerer, budget *BodyBudget) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_requests_total",
			Help: "Requests routed, by chosen replica, policy and decision reason.",
		}, []string{"replica", "policy", "reason"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_errors_total",
			Help: "Requests answered with a router error, by error code.",
		}, []string{"code"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_retries_total",
			Help: "Attempts retried on another replica before the first byte, by the replica that failed.",
		}, []string{"replica"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_ttft_seconds",
			Help:    "Time from request arrival at the router to the first response byte, seconds, of the routed completion requests answered ok (not pass-through calls, not errors), by replica and model.",
			Buckets: latencyBuckets,
		}, []string{"replica", "model"}),
		e2e: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvrouter_e2e_seconds",
			Help:    "Time from request arrival at the router to the end of the response, seconds, of the routed completion requests answered ok (not pass-through calls, not errors), by replica and model.",
			Buckets: latencyBuckets,
		}, []string{"replica", "model"}),
		predicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_predicted_cached_tokens_total",
			Help: "Prompt tokens the policy predicted cached on the chosen replica, in the engine's tokens (the predicted share of the router's estimate), over the requests whose usage reported prompt and cached tokens.",
		}, []string{"replica"}),
		actual: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_actual_cached_tokens_total",
			Help: "Prompt tokens the engine reported cached (usage.prompt_tokens_details.cached_tokens), over the requests whose usage reported prompt and cached tokens.",
		}, []string{"replica"}),
		prompt: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_prompt_tokens_total",
			Help: "Prompt tokens the engine reported (usage.prompt_tokens), over the requests whose usage reported prompt and cached tokens: the hit rates' denominator.",
		}, []string{"replica"}),
		decide: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvrouter_decision_seconds",
			Help:    "Time to parse, hash, match and pick, seconds.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 2, 18),
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.errors, m.retries, m.ttft, m.e2e, m.predicted, m.actual, m.prompt, m.decide} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}

	m.adminErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_admin_errors_total",
		Help: "Admin-surface requests answered with an error (a missing or wrong admin key, an unknown path), by error code.",
	}, []string{"code"})
	m.draining = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvrouter_draining",
		Help: "1 once the router drains (SIGTERM): unready, finishing the requests in flight; else 0.",
	})
	for _, c := range []prometheus.Collector{m.adminErrors, m.draining} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}

	// Upstream safety.
	m.timeouts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_upstream_timeouts_total",
		Help: "Upstream attempts that timed out, by kind: connect, ttft (headers and first token), idle (a stream's silence), total (the request's limit), probe (failed probes ejected the replica while the attempt waited for its answer or first token).",
	}, []string{"kind"})
	m.midstream = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_stream_failures_total",
		Help: "Streams whose replica failed after the first token reached the client, by result: continued on another replica, or error (ended with an SSE error event).",
	}, []string{"result"})
	m.ejections = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_ejections_total",
		Help: "Replicas taken out of service, by replica and kind: probe (failed health probes), passive (failed requests), connect (a refused connection).",
	}, []string{"replica", "kind"})
	m.stallHolds = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvrouter_stall_holds_total",
		Help: "Attempts kept waiting when failed probes ejected their replica before its first token and no other replica was in service to retry on (every engine stalled at once): on their replica, or for the first replica back.",
	})
	m.readmitted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_readmission_refused_total",
		Help: "Times a replica whose ejection was over was kept out, by replica: its /v1/models did not list the expected models, or could not be read.",
	}, []string{"replica"})
	// The fixed label sets start at zero, so that rate() and the
	// dashboard see them before the first failure.
	for _, k := range []string{timeoutConnect, timeoutTTFT, timeoutIdle, timeoutTotal, timeoutProbe} {
		m.timeouts.WithLabelValues(k)
	}
	m.midstream.WithLabelValues(midContinued)
	m.midstream.WithLabelValues(midError)
	for _, c := range []prometheus.Collector{m.timeouts, m.midstream, m.ejections, m.readmitted, m.stallHolds} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}

	if err := m.registerOutcomes(reg); err != nil {
		return nil, err
	}
	if err := m.registerHealth(reg); err != nil {
		return nil, err
	}
	if err := m.registerGuards(reg, budget); err != nil {
		return nil, err
	}

	// Limits (issue 13).
	m.headerRejected = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvrouter_header_rejected_total",
		Help: "Connections the server closed while reading a request header, before any handler: a header over --max-header-bytes (answered 431), a malformed request (400), or one not complete within --read-header-timeout.",
	})
	if err := reg.Register(m.headerRejected); err != nil {
		return nil, err
	}

	return m, nil
}

// fleetCollector exports per-replica gauges read at collection time from
// one fleet view: in-flight requests, health (1 healthy, 0 not) and the
// blocks the residency index attributes to the replica.
type fleetCollector struct {
	fl                          *fleet.Fleet
	now                         func() time.Time
	inflight, healthy, idxBlock *prometheus.Desc

	// Limits (issue 13).
	sessions, evicted *prometheus.Desc
}

func newFleetCollector(fl *fleet.Fleet, now func() time.Time) *fleetCollector {
	l := []string{"replica"}
	return &fleetCollector{
		fl:       fl,
		now:      now,
		inflight: prometheus.NewDesc("kvrouter_inflight", "Requests the router has in flight on the replica.", l, nil),
		healthy:  prometheus.NewDesc("kvrouter_replica_healthy", "1 when the replica gets traffic, 0 when it is unhealthy.", l, nil),
		idxBlock: prometheus.NewDesc("kvrouter_index_blocks", "Prefix blocks the residency index attributes to the replica.", l, nil),

		sessions: prometheus.NewDesc("kvrouter_sessions", "Sessions bound to a replica (at most --max-sessions).", nil, nil),
		evicted:  prometheus.NewDesc("kvrouter_sessions_evicted_total", "Sessions dropped, least recently used first, to stay within --max-sessions.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (fc *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- fc.inflight
	ch <- fc.healthy
	ch <- fc.idxBlock
	ch <- fc.sessions
	ch <- fc.evicted
}

// Collect implements prometheus.Collector.
func (fc *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	var s route.Snapshot
	fc.fl.Snapshot(&s, fc.now(), 0)
	// One series per replica id, removed twins folded in (metricseries.go).
	for _, r := range replicaSeries(fc.fl.Members(), s.Replicas, nil) {
		ch <- prometheus.MustNewConstMetric(fc.inflight, prometheus.GaugeValue, float64(r.inflight), r.id)
		ch <- prometheus.MustNewConstMetric(fc.healthy, prometheus.GaugeValue, b01(r.healthy), r.id)
		ch <- prometheus.MustNewConstMetric(fc.idxBlock, prometheus.GaugeValue, float64(r.blocks), r.id)
	}
	ch <- prometheus.MustNewConstMetric(fc.sessions, prometheus.GaugeValue, float64(fc.fl.Sessions()))
	ch <- prometheus.MustNewConstMetric(fc.evicted, prometheus.CounterValue, float64(fc.fl.SessionsEvicted()))
}

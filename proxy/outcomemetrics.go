package proxy

import (
	"net/http"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/view"
)

// Outcomes, the outcome label of kvrouter_completion_requests_total and
// kvrouter_passthrough_requests_total: a small fixed set.
const (
	// outcomeOK: answered with a status below 400 and, for a stream, its
	// end delivered.
	outcomeOK = "ok"
	// outcomeClientError: a 4xx for the request itself (bad JSON, an
	// unknown model, a body too large, or the replica's own 4xx).
	outcomeClientError = "client_error"
	// outcomeUpstreamError: a replica failed: a 5xx, no replica reachable,
	// a stream cut short.
	outcomeUpstreamError = "upstream_error"
	// outcomeRejected: the router shed the request (429 queue full or
	// sheddable, 503 no healthy replica, shutting down), or a replica
	// answered 429.
	outcomeRejected = "rejected"
	// outcomeTimeout: no replica answered in time (504), or a stream
	// stalled past its timeout.
	outcomeTimeout = "timeout"
	// outcomeCanceled: the client went away first.
	outcomeCanceled = "canceled"
)

// otherModel is the model label of a request for a model no replica lists
// (or past maxModelLabels).
const otherModel = "other"

// maxModelLabels bounds the model label's values: the first this many
// models the replicas list get their own; the rest are otherModel.
const maxModelLabels = 64

// registerOutcomes creates and registers the outcome counters, the
// pass-through duration and kvrouter_build_info.
func (m *metrics) registerOutcomes(reg prometheus.Registerer) error {
	m.completions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_completion_requests_total",
		Help: "Requests to /v1/chat/completions and /v1/completions, by endpoint, model (the models the replicas list; any other is \"other\"), outcome (ok, client_error, upstream_error, rejected, timeout, canceled) and code (the HTTP status sent; 0: none was).",
	}, []string{"endpoint", "model", "outcome", "code"})
	m.pass = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_passthrough_requests_total",
		Help: "Pass-through calls (--pass-through paths), by the listed prefix matched, outcome and code (the HTTP status sent; 0: none was).",
	}, []string{"prefix", "outcome", "code"})
	m.passDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "kvrouter_passthrough_duration_seconds",
		Help:    "Time from a pass-through call's arrival to the end of its response, seconds, by the listed prefix matched.",
		Buckets: latencyBuckets,
	}, []string{"prefix"})
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvrouter_build_info",
		Help: "1, labelled with the router's build: module version, VCS revision, whether the tree was modified (dirty), Go version.",
	}, []string{"version", "revision", "dirty", "goversion"})
	info.WithLabelValues(buildLabels()).Set(1)
	for _, c := range []prometheus.Collector{m.completions, m.pass, m.passDur, info} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// buildLabels reads the binary's build information: the main module's
// version ("(devel)" for a build from a checkout), vcs.revision and
// vcs.modified ("" when the build recorded none) and the Go version.
func buildLabels() (version, revision, dirty, goversion string) {
	version, goversion = "unknown", runtime.Version()
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return version, "", "", goversion
	}
	version = bi.Main.Version
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			dirty = s.Value
		}
	}
	return version, revision, dirty, goversion
}

// observe records a finished call's outcome: a completion request in
// kvrouter_completion_requests_total and, answered ok by a replica, in the
// TTFT and end-to-end histograms; a pass-through call in its own counter
// and histogram.
func (rt *Router) observe(c *call) {
	out, code := c.metricOutcome(), statusLabel(c.status)
	dur := c.end.Sub(c.start).Seconds()
	if !c.routed {
		if c.pass != "" {
			rt.m.pass.WithLabelValues(c.pass, out, code).Inc()
			rt.m.passDur.WithLabelValues(c.pass).Observe(dur)
		}
		return
	}
	model := otherModel
	if c.prompt != nil {
		model = rt.m.models.label(rt.st.fleet, c.prompt.Model, c.end)
	}
	rt.m.completions.WithLabelValues(c.path, model, out, code).Inc()
	if out != outcomeCanceled {
		rt.requests.Add(1)
		if out != outcomeOK {
			rt.requestsFailed.Add(1)
		}
	}
	if out != outcomeOK || c.replica < 0 {
		return
	}
	name := rt.name(c.replica)
	if c.ttft > 0 {
		rt.m.ttft.WithLabelValues(name, model).Observe(c.ttft.Seconds())
	}
	rt.m.e2e.WithLabelValues(name, model).Observe(dur)
}

// metricOutcome classifies a finished call into one of the outcomes.
func (c *call) metricOutcome() string {
	cut := c.tapped && c.tap.Cut
	switch {
	case c.outcome == view.OutcomeCanceled:
		return outcomeCanceled
	case c.status == 504 || c.errCode == codeUpstreamTimeout || cut && c.tap.CutCode == codeUpstreamTimeout:
		return outcomeTimeout
	case c.status == 429 || c.errCode != "" && c.status == 503:
		return outcomeRejected
	case c.outcome == view.OutcomeUpstreamError || c.status >= 500:
		return outcomeUpstreamError
	case c.status >= 400:
		return outcomeClientError
	}
	return outcomeOK
}

// statusLabel is the code label of status: its decimal digits, "0" when no
// status was sent (or one outside 100..599).
func statusLabel(status int) string {
	switch {
	case status < 100 || status > 599:
		return "0"
	case status == http.StatusOK: // the common case, without allocating
		return "200"
	}
	return strconv.Itoa(status)
}

// modelLabels bounds the model label to the models the replicas list (at
// most maxModelLabels), read from the fleet at most once a second. The
// zero value is ready. mu guards at; set is swapped whole.
type modelLabels struct {
	mu  sync.Mutex
	at  time.Time
	set atomic.Pointer[map[string]struct{}]
}

// label is model itself when a replica lists it, else otherModel.
func (ml *modelLabels) label(fl *fleet.Fleet, model string, now time.Time) string {
	if ml.mu.TryLock() {
		if now.Sub(ml.at) >= time.Second || ml.set.Load() == nil {
			ml.at = now
			ml.set.Store(listedModels(fl))
		}
		ml.mu.Unlock()
	}
	if s := ml.set.Load(); s != nil {
		if _, ok := (*s)[model]; ok {
			return model
		}
	}
	return otherModel
}

// listedModels is the set of the models the fleet's replicas list or were
// declared with, at most maxModelLabels of them.
func listedModels(fl *fleet.Fleet) *map[string]struct{} {
	set := map[string]struct{}{}
	for _, id := range fl.Replicas() {
		models, _ := fl.Models(id)
		for _, m := range models {
			if len(set) >= maxModelLabels {
				return &set
			}
			set[m.ID] = struct{}{}
		}
	}
	return &set
}

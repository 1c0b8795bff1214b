package proxy

import "github.com/prometheus/client_golang/prometheus"

// guardMetrics are the instruments of the router's guards against
// hostile peers: replicas whose answers are not the protocol (judge.go).
type guardMetrics struct {
	invalid *prometheus.CounterVec // replica, kind
}

// registerGuards creates and registers the guards' instruments.
func (m *metrics) registerGuards(reg prometheus.Registerer) error {
	m.invalid = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_upstream_invalid_total",
		Help: "Routed answers with status 200 that were not the protocol, each a failure of the replica (passive health) retried elsewhere, by replica and kind: content_type (not an event stream for a streamed request, not JSON otherwise), no_choices (JSON without a \"choices\" array), no_chunk (a stream that ended before any completion chunk).",
	}, []string{"replica", "kind"})
	return reg.Register(m.invalid)
}

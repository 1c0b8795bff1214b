package epp

import "github.com/prometheus/client_golang/prometheus"

// metrics are the picker's own; the routing's (decisions, errors the
// router answers, per-replica load) are the router's.
type metrics struct {
	streams  prometheus.Gauge
	requests *prometheus.CounterVec
	errors   *prometheus.CounterVec
	served   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvrouter_epp_streams",
			Help: "Envoy ext_proc streams (HTTP requests) open at the endpoint picker.",
		}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_epp_requests_total",
			Help: "Requests the endpoint picker decided, by result: routed (an endpoint picked) or answered (the router answered with an error, kvrouter_errors_total says which).",
		}, []string{"result"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_epp_errors_total",
			Help: "Streams the endpoint picker ended itself, by code: request_too_large, body_budget_exhausted, body_timeout, ttft_timeout (no response within --ttft-timeout of the routing), idle_timeout, invalid_path, unsupported_body_mode, protocol_error.",
		}, []string{"code"}),
	}
	m.served = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_epp_served_total",
		Help: "Routed responses by the endpoint the data plane reported serving them (x-gateway-destination-endpoint-served): primary (the picked one), fallback (a later one of the list: the picked one could not be reached), unreported.",
	}, []string{"endpoint"})
	for _, c := range []prometheus.Collector{m.streams, m.requests, m.errors, m.served} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

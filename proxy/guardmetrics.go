package proxy

import "github.com/prometheus/client_golang/prometheus"

// guardMetrics are the instruments of the router's guards against
// hostile peers: replicas whose answers are not the protocol (judge.go);
// the body budget's are read from it (budgetCollector).
type guardMetrics struct {
	invalid *prometheus.CounterVec // replica, kind
}

// registerGuards creates and registers the guards' instruments, and the
// body budget's (budget.go).
func (m *metrics) registerGuards(reg prometheus.Registerer, b *BodyBudget) error {
	if err := reg.Register(newBudgetCollector(b)); err != nil {
		return err
	}
	m.invalid = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_upstream_invalid_total",
		Help: "Routed answers with status 200 that were not the protocol, each a failure of the replica (passive health) retried elsewhere, by replica and kind: content_type (not an event stream for a streamed request, not JSON otherwise), no_choices (JSON without a \"choices\" array), no_chunk (a stream that ended before any completion chunk).",
	}, []string{"replica", "kind"})
	return reg.Register(m.invalid)
}

// budgetCollector exports a BodyBudget: its bound, the bytes held and the
// requests refused.
type budgetCollector struct {
	b                    *BodyBudget
	limit, held, refused *prometheus.Desc
}

func newBudgetCollector(b *BodyBudget) *budgetCollector {
	return &budgetCollector{
		b:       b,
		limit:   prometheus.NewDesc("kvrouter_body_budget_bytes", "The bound of the request bodies held in memory together, bytes (--max-body-bytes-total; 0: a 16th of the memory limit, at most 32 maximal bodies).", nil, nil),
		held:    prometheus.NewDesc("kvrouter_body_bytes_held", "Bytes of request bodies held in memory now, as the body budget counts them (a declared length whole, a chunked body as its buffer grows).", nil, nil),
		refused: prometheus.NewDesc("kvrouter_body_budget_refused_total", "Requests answered 503 body_budget_exhausted, before their body was read, because it would take the bodies held past --max-body-bytes-total (the endpoint picker's too).", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (bc *budgetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- bc.limit
	ch <- bc.held
	ch <- bc.refused
}

// Collect implements prometheus.Collector.
func (bc *budgetCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(bc.limit, prometheus.GaugeValue, float64(bc.b.Limit()))
	ch <- prometheus.MustNewConstMetric(bc.held, prometheus.GaugeValue, float64(bc.b.Held()))
	ch <- prometheus.MustNewConstMetric(bc.refused, prometheus.CounterValue, float64(bc.b.Refused()))
}

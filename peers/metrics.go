package peers

import (
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/fleet"
)

// metrics are a Syncer's instruments, registered on Config.Registry.
type metrics struct {
	errors       counter
	decodeErrors prometheus.Counter
	rejected     *prometheus.CounterVec // kind: member, session, load, event
	dropped      prometheus.Counter
	round        prometheus.Histogram
	log          *slog.Logger
	warned       atomic.Bool // the first rejection was logged
}

// counter is a prometheus.Counter whose count can be read back.
type counter struct {
	prometheus.Counter
	n atomic.Int64
}

func (c *counter) Inc() {
	c.n.Add(1)
	c.Counter.Inc()
}

func (c *counter) get() int64 { return c.n.Load() }

func newMetrics(reg prometheus.Registerer, s *Syncer) (*metrics, error) {
	m := &metrics{
		log: s.log,
		errors: counter{Counter: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_shared_state_errors_total",
			Help: "Rounds of the shared-state sync that did not reach Redis.",
		})},
		decodeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_shared_state_decode_errors_total",
			Help: "Shares read from Redis that could not be decoded (skipped).",
		}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_shared_state_rejected_total",
			Help: "Values read from Redis that are not sealed with --redis-key-file's secret (forged, or written by a router without it or with another), ignored, by kind: member, session, load, event.",
		}, []string{"kind"}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_shared_state_dropped_total",
			Help: "Session bindings and routed-block entries not shared: more than fit between two rounds.",
		}),
		round: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvrouter_shared_state_round_seconds",
			Help:    "Time of one shared-state round with Redis (publish and read).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
	}
	for _, k := range []string{KindMember, KindSession, KindLoad, KindEvent} {
		m.rejected.WithLabelValues(k)
	}
	if reg == nil {
		return m, nil
	}
	up := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvrouter_shared_state_up",
		Help: "1 when the last shared-state round reached Redis, 0 when the router routes on its own view.",
	}, func() float64 {
		if s.Up() {
			return 1
		}
		return 0
	})
	peers := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kvrouter_shared_state_peers",
		Help: "Other routers whose load the last round read.",
	}, func() float64 { return float64(s.Peers()) })
	for _, c := range []prometheus.Collector{up, peers, peerLoad{s.f}, m.errors.Counter, m.decodeErrors, m.rejected, m.dropped, m.round} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("peers metrics: %w", err)
		}
	}
	return m, nil
}

// reject counts a value of kind that failed the seal's check, logging the
// first.
func (m *metrics) reject(kind string) {
	m.rejected.WithLabelValues(kind).Inc()
	if !m.warned.Swap(true) {
		m.log.Warn("shared value ignored: not sealed with this router's --redis-key-file secret (forged, or a router with another or none)", "kind", kind)
	}
}

// peerLoad exports the other routers' in-flight requests per replica, as
// the fleet's last merge left them.
type peerLoad struct{ f *fleet.Fleet }

var peerInFlight = prometheus.NewDesc("kvrouter_peer_inflight",
	"Requests the other routers have in flight on the replica, as the last shared-state round read.", []string{"replica"}, nil)

// Describe implements prometheus.Collector.
func (peerLoad) Describe(ch chan<- *prometheus.Desc) { ch <- peerInFlight }

// Collect implements prometheus.Collector.
func (p peerLoad) Collect(ch chan<- prometheus.Metric) {
	for _, id := range p.f.Replicas() {
		ch <- prometheus.MustNewConstMetric(peerInFlight, prometheus.GaugeValue, float64(p.f.PeerLoad(id).InFlight), id)
	}
}

var _ prometheus.Collector = peerLoad{}

package proxy

import "github.com/prometheus/client_golang/prometheus"

// b01 is 1 for true, 0 for false.
func b01(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// modeCollector exports kvrouter_index_mode{replica,mode}: 1 for the feed
// each replica is matched against now, 0 for the other.
type modeCollector struct {
	p    *precise
	desc *prometheus.Desc
}

func newModeCollector(p *precise) *modeCollector {
	return &modeCollector{p: p, desc: prometheus.NewDesc("kvrouter_index_mode",
		"1 for the residency feed the replica is matched against (precise: its KV events; approximate: the router's own routing), 0 for the other.",
		[]string{"replica", "mode"}, nil)}
}

// Describe implements prometheus.Collector.
func (mc *modeCollector) Describe(ch chan<- *prometheus.Desc) { ch <- mc.desc }

// Collect implements prometheus.Collector.
func (mc *modeCollector) Collect(ch chan<- prometheus.Metric) {
	for i, be := range mc.p.bes.list() {
		name := be.cfg.URL
		if mc.p.fl.At(name) != i {
			continue // removed
		}
		live := b01(mc.p.fl.Tracker().Live(i))
		ch <- prometheus.MustNewConstMetric(mc.desc, prometheus.GaugeValue, live, name, IndexPrecise)
		ch <- prometheus.MustNewConstMetric(mc.desc, prometheus.GaugeValue, 1-live, name, IndexApproximate)
	}
}

// label names replica i by its URL in the kvevents metrics, as every other
// router metric does.
func (p *precise) label(i int) string {
	return p.bes.at(i).cfg.URL
}

var _ prometheus.Collector = (*modeCollector)(nil)

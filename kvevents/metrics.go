package kvevents

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics exposes every replica's stream health to Prometheus. It is a
// collector over Subscriber.Statuses, read at scrape time: the ingest path
// only updates its atomic counters and knows nothing of Prometheus.
type Metrics struct {
	sub   *Subscriber
	label func(replica int) string

	events, stored, removed, batches, gaps, replays, resets, orphans, decodeErrors *prometheus.Desc
	connected, stale, lastEventAge, blocks, unmatched                              *prometheus.Desc
	rejected                                                                       *prometheus.Desc
}

// NewMetrics registers the metrics of sub on reg:
// kvrouter_kv_events_total, kvrouter_kv_event_blocks_stored_total,
// kvrouter_kv_event_blocks_removed_total, kvrouter_kv_event_batches_total,
// kvrouter_kv_event_gaps_total, kvrouter_kv_event_replays_total,
// kvrouter_kv_event_resets_total, kvrouter_kv_event_orphans_total,
// kvrouter_kv_event_decode_errors_total, kvrouter_kv_events_connected,
// kvrouter_kv_events_stale, kvrouter_kv_events_last_event_age_seconds
// (-1 before the first event), kvrouter_kv_event_blocks (engine blocks
// known), all labelled by replica, and
// kvrouter_kv_event_unmatched_total (bind-mode messages of unknown
// topics) and kvrouter_kv_events_rejected_total{reason} (connections,
// messages and blocks refused or not trusted, by Reason: a fixed set of
// labels, every one exported from the start). label names a replica in the replica label (the router uses its
// URL); nil means its ID in decimal. A replica whose label is "" is
// left out.
func NewMetrics(reg prometheus.Registerer, sub *Subscriber, label func(replica int) string) (*Metrics, error) {
	if label == nil {
		label = strconv.Itoa
	}
	l := []string{"replica"}
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc("kvrouter_"+name, help, labels, nil)
	}
	m := &Metrics{
		sub:          sub,
		label:        label,
		events:       d("kv_events_total", "KV events applied (BlockStored, BlockRemoved, AllBlocksCleared).", l),
		stored:       d("kv_event_blocks_stored_total", "Blocks reported stored.", l),
		removed:      d("kv_event_blocks_removed_total", "Blocks reported removed.", l),
		batches:      d("kv_event_batches_total", "Event batches received (live or replayed).", l),
		gaps:         d("kv_event_gaps_total", "Sequence gaps detected.", l),
		replays:      d("kv_event_replays_total", "Replays that filled a gap or rebuilt the index.", l),
		resets:       d("kv_event_resets_total", "Times the replica's index entries were dropped.", l),
		orphans:      d("kv_event_orphans_total", "Stored blocks skipped for an unknown parent.", l),
		decodeErrors: d("kv_event_decode_errors_total", "Messages that did not decode.", l),
		connected:    d("kv_events_connected", "1 if the event stream is connected.", l),
		stale:        d("kv_events_stale", "1 if the stream is stale or down: the router falls back to approximate tracking.", l),
		lastEventAge: d("kv_events_last_event_age_seconds", "Seconds since the last event batch; -1 before the first.", l),
		blocks:       d("kv_event_blocks", "Engine blocks the router knows the replica holds.", l),
		unmatched:    d("kv_event_unmatched_total", "Bind-mode messages whose topic matched no replica.", nil),
		rejected: d("kv_events_rejected_total", "KV-event input refused or not trusted, by reason: peer, conns, handshake, size, timeout, "+
			"protocol (connections closed), malformed, topic, unknown_topic, seq_jump, queue (messages), unknown_removal (blocks).", []string{"reason"}),
	}
	if err := reg.Register(m); err != nil {
		return nil, err
	}
	return m, nil
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.events, m.stored, m.removed, m.batches, m.gaps, m.replays, m.resets,
		m.orphans, m.decodeErrors, m.connected, m.stale, m.lastEventAge, m.blocks, m.unmatched, m.rejected} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	counter := func(d *prometheus.Desc, v uint64, r string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), r)
	}
	gauge := func(d *prometheus.Desc, v float64, r string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, r)
	}
	for _, s := range m.sub.Statuses() {
		r := m.label(s.Replica)
		if r == "" {
			continue
		}
		counter(m.events, s.Events, r)
		counter(m.stored, s.Stored, r)
		counter(m.removed, s.Removed, r)
		counter(m.batches, s.Batches, r)
		counter(m.gaps, s.Gaps, r)
		counter(m.replays, s.Replays, r)
		counter(m.resets, s.Resets, r)
		counter(m.orphans, s.Orphans, r)
		counter(m.decodeErrors, s.DecodeErrors, r)
		gauge(m.connected, float64(b2i(s.Connected)), r)
		gauge(m.stale, float64(b2i(s.Stale)), r)
		age := -1.0
		if !s.LastEvent.IsZero() {
			age = now.Sub(s.LastEvent).Seconds()
		}
		gauge(m.lastEventAge, age, r)
		gauge(m.blocks, float64(s.Blocks), r)
	}
	ch <- prometheus.MustNewConstMetric(m.unmatched, prometheus.CounterValue, float64(m.sub.Unmatched()))
	for r := range numReasons {
		counter(m.rejected, m.sub.Rejected(r), r.String())
	}
}

var _ prometheus.Collector = (*Metrics)(nil)

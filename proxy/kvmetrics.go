package proxy

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// eventsCollector exports every followed replica's KV-event stream health,
// read from the Subscriber's statuses at collection time, labelled by the
// replica's URL like every other router metric. It exports the series
// kvevents.Metrics defines (kvrouter_kv_events_total,
// kvrouter_kv_event_blocks_stored_total, kvrouter_kv_event_blocks_removed_total,
// kvrouter_kv_event_batches_total, kvrouter_kv_event_gaps_total,
// kvrouter_kv_event_replays_total, kvrouter_kv_event_resets_total,
// kvrouter_kv_event_orphans_total, kvrouter_kv_event_decode_errors_total,
// kvrouter_kv_events_connected, kvrouter_kv_events_stale,
// kvrouter_kv_events_last_event_age_seconds (-1 before the first event),
// kvrouter_kv_event_blocks, and the unlabelled
// kvrouter_kv_event_unmatched_total), in place of kvevents.Metrics, whose
// replica label is the residency index ("0", "1").
type eventsCollector struct {
	p *precise

	events, stored, removed, batches, gaps, replays, resets, orphans, decodeErrors *prometheus.Desc
	connected, stale, lastEventAge, blocks, unmatched                              *prometheus.Desc
}

func newEventsCollector(p *precise) *eventsCollector {
	l := []string{"replica"}
	d := func(name, help string, labels []string) *prometheus.Desc {
		return prometheus.NewDesc("kvrouter_"+name, help, labels, nil)
	}
	return &eventsCollector{
		p:            p,
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
	}
}

// Describe implements prometheus.Collector.
func (c *eventsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.events, c.stored, c.removed, c.batches, c.gaps, c.replays, c.resets,
		c.orphans, c.decodeErrors, c.connected, c.stale, c.lastEventAge, c.blocks, c.unmatched} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *eventsCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	counter := func(d *prometheus.Desc, v uint64, r string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), r)
	}
	gauge := func(d *prometheus.Desc, v float64, r string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, r)
	}
	for _, s := range c.p.sub.Statuses() {
		if s.Replica < 0 || s.Replica >= len(c.p.names) {
			continue
		}
		r := c.p.names[s.Replica]
		counter(c.events, s.Events, r)
		counter(c.stored, s.Stored, r)
		counter(c.removed, s.Removed, r)
		counter(c.batches, s.Batches, r)
		counter(c.gaps, s.Gaps, r)
		counter(c.replays, s.Replays, r)
		counter(c.resets, s.Resets, r)
		counter(c.orphans, s.Orphans, r)
		counter(c.decodeErrors, s.DecodeErrors, r)
		gauge(c.connected, b01(s.Connected), r)
		gauge(c.stale, b01(s.Stale), r)
		age := -1.0
		if !s.LastEvent.IsZero() {
			age = now.Sub(s.LastEvent).Seconds()
		}
		gauge(c.lastEventAge, age, r)
		gauge(c.blocks, float64(s.Blocks), r)
	}
	ch <- prometheus.MustNewConstMetric(c.unmatched, prometheus.CounterValue, float64(c.p.sub.Unmatched()))
}

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
	for i, name := range mc.p.names {
		live := b01(mc.p.live[i].Load())
		ch <- prometheus.MustNewConstMetric(mc.desc, prometheus.GaugeValue, live, name, IndexPrecise)
		ch <- prometheus.MustNewConstMetric(mc.desc, prometheus.GaugeValue, 1-live, name, IndexApproximate)
	}
}

var (
	_ prometheus.Collector = (*eventsCollector)(nil)
	_ prometheus.Collector = (*modeCollector)(nil)
)

package record

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the recorder's instruments. One set serves every recording
// of a router (a recording started, stopped and started again counts on).
type Metrics struct {
	lines     prometheus.Counter
	bytes     prometheus.Counter
	rotations prometheus.Counter
	dropped   *prometheus.CounterVec // reason: queue_full, write_error, stopped
	errors    *prometheus.CounterVec // op: open, write, rotate, close
	recording prometheus.Gauge
}

// NewMetrics makes the instruments and registers them on reg (nil: not
// registered).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		lines: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_record_lines_total",
			Help: "Requests written to the recording (--record), one line each.",
		}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_record_bytes_total",
			Help: "Bytes written to the recording.",
		}),
		rotations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvrouter_record_rotations_total",
			Help: "Rotations of the recording's file at --record-max-bytes.",
		}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_record_dropped_total",
			Help: "Requests not recorded, by reason: queue_full (the writer fell behind; the request was served), write_error (the file could not be opened or written: see kvrouter_record_errors_total), stopped (the request ended after the recording did).",
		}, []string{"reason"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_record_errors_total",
			Help: "Failed operations on the recording's file, by op: open, write, rotate, close. Requests are served regardless.",
		}, []string{"op"}),
		recording: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvrouter_record_active",
			Help: "1 while a recording runs, else 0.",
		}),
	}
	for _, r := range []string{"queue_full", "write_error", "stopped"} {
		m.dropped.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.lines, m.bytes, m.rotations, m.dropped, m.errors, m.recording} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

package emulator

import (
	"math"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/engine"
)

// transferMetrics count the KV transfers a replica takes part in: the
// emulator's own (emulator_kv_...), and with the vLLM metrics flavor those
// of vLLM's NixlConnector that apply (NixlPromMetrics in
// vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py, vLLM
// commit 002a105), observed by the reader as there, in engine time.
type transferMetrics struct {
	outcomes       *prometheus.CounterVec // outcome
	ignored        *prometheus.CounterVec // param
	received, sent prometheus.Counter     // blocks
	// xferTime, xferBytes and failed are vLLM's; nil with another flavor.
	xferTime, xferBytes prometheus.Observer
	failed              prometheus.Counter
}

func newTransferMetrics(reg prometheus.Registerer, cfg Config, stats func() *engine.Stats) *transferMetrics {
	m := &transferMetrics{
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "emulator_kv_transfers_total",
			Help: "KV reads asked for by decode legs (kv_transfer_params do_remote_prefill with remote_block_ids), by outcome: received, partial (only the leading part), not_held (the source holds nothing for the request: expired or read), mismatch (not the prompt's blocks), unreachable, refused, invalid; all but received and partial recompute the prompt.",
		}, []string{"outcome"}),
		ignored: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "emulator_kv_params_ignored_total",
			Help: "Requests whose kv_transfer_params the engine's --kv-role does not serve, served as plain requests, by param: do_remote_decode on a decode engine, do_remote_prefill on a prefill engine.",
		}, []string{"param"}),
		received: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "emulator_kv_transfer_received_blocks_total",
			Help: "KV blocks read from prefill workers.",
		}),
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "emulator_kv_transfer_sent_blocks_total",
			Help: "KV blocks sent to decode workers that read them on the side channel.",
		}),
	}
	for _, o := range []string{outcomeReceived, outcomePartial, outcomeNotHeld, outcomeMismatch, outcomeUnreachable, outcomeRefused, outcomeInvalid} {
		m.outcomes.WithLabelValues(o)
	}
	for _, p := range []string{"do_remote_decode", "do_remote_prefill"} {
		m.ignored.WithLabelValues(p)
	}
	reg.MustRegister(m.outcomes, m.ignored, m.received, m.sent,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "emulator_kv_held_blocks",
			Help: "KV blocks finished prefill legs hold for decode workers to read (counted in the KV usage; not evictable).",
		}, func() float64 { return float64(stats().HeldBlocks) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "emulator_kv_hold_expired_total",
			Help: "Prefill legs whose held blocks nobody read within --kv-hold-timeout, freed unread.",
		}, func() float64 { return float64(stats().ExpiredHolds) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "emulator_kv_transfer_config_info",
			Help: "The engine's KV-transfer configuration: kv_role (prefill, decode or both), engine_id (remote_engine_id), kv_hold_timeout_seconds.",
			ConstLabels: prometheus.Labels{
				"kv_role":                 cfg.KVRole.String(),
				"engine_id":               cfg.EngineID,
				"kv_connector":            "NixlConnector",
				"kv_hold_timeout_seconds": strconv.FormatFloat(cfg.KVHoldTimeout.Seconds(), 'g', -1, 64),
			},
		}, func() float64 { return 1 }),
	)
	if cfg.MetricsFlavor == FlavorVLLM {
		m.vllm(reg, cfg.Model)
	}
	return m
}

// vllm registers the NixlConnector's metrics that apply to the emulator.
// vllm:nixl_post_time_seconds, vllm:nixl_num_descriptors and
// vllm:nixl_num_failed_notifications describe NIXL itself and are left
// out.
func (m *transferMetrics) vllm(reg prometheus.Registerer, model string) {
	labels := prometheus.Labels{"model_name": model, "engine": "0"}
	xferTime := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "vllm:nixl_xfer_time_seconds", Help: "Histogram of transfer duration for NIXL KV Cache transfers.",
		Buckets:     []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0},
		ConstLabels: labels,
	})
	bytesBuckets := make([]float64, 0, 12)
	for i := 1; i < 25; i += 2 {
		bytesBuckets = append(bytesBuckets, math.Exp2(float64(10+i))) // 2 KiB to 8 GiB, as vLLM's
	}
	xferBytes := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "vllm:nixl_bytes_transferred", Help: "Histogram of bytes transferred per NIXL KV Cache transfers.",
		Buckets: bytesBuckets, ConstLabels: labels,
	})
	failed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "vllm:nixl_num_failed_transfers_total", Help: "Number of failed NIXL KV Cache transfers.",
		ConstLabels: labels,
	})
	reg.MustRegister(xferTime, xferBytes, failed)
	m.xferTime, m.xferBytes, m.failed = xferTime, xferBytes, failed
}

// observe records a read of size bytes whose blocks left the source's
// link took d (engine time), as vLLM's reader records a NIXL transfer.
func (m *transferMetrics) observe(d time.Duration, size int64) {
	if m.xferTime != nil {
		m.xferTime.Observe(d.Seconds())
		m.xferBytes.Observe(float64(size))
	}
}

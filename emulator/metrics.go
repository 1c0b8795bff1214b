package emulator

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/engine"
)

// metrics are the replica's Prometheus instruments, on the server's own
// registry. Gauges and cumulative counters read the engine's Stats
// snapshot at scrape time; histograms and token counters are fed by the
// engine goroutine when a request finishes.
//
// Latency histograms are in ENGINE time (model seconds), not wall time: with
// TimeScale 0.05 a TTFT of 0.2 s is 10 ms of wall time. That keeps them
// comparable with a real engine's whatever the time scale.
//
// Names follow vllm/v1/metrics/loggers.py (vLLM) or
// python/sglang/srt/metrics/collector.py (SGLang).
type metrics struct {
	ttft, itl, e2e, queue prometheus.Observer
	prompt, generation    prometheus.Counter
	requests              prometheus.Counter // finished requests
}

// Histogram buckets as in vLLM's loggers.py, in seconds.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
		0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	itlBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
		1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	requestBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
		30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// newMetrics registers the instruments of flavor on reg. stats returns the
// latest engine snapshot (never nil).
func newMetrics(reg prometheus.Registerer, flavor, model string, ec engine.Config, stats func() *engine.Stats) *metrics {
	if flavor == FlavorSGLang {
		return sglangMetrics(reg, model, ec, stats)
	}
	return vllmMetrics(reg, model, ec, stats)
}

func vllmMetrics(reg prometheus.Registerer, model string, ec engine.Config, stats func() *engine.Stats) *metrics {
	labels := prometheus.Labels{"model_name": model, "engine": "0"}
	f := factory{reg: reg, ns: "vllm:", labels: labels}
	f.gauge("num_requests_running", "Number of requests in model execution batches.",
		func(s *engine.Stats) float64 { return float64(s.Running) }, stats)
	f.gauge("num_requests_waiting", "Number of requests waiting to be processed.",
		func(s *engine.Stats) float64 { return float64(s.Waiting) }, stats)
	f.gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", kvUsage, stats)
	f.counter("prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
		func(s *engine.Stats) float64 { return float64(s.PrefixQueries) }, stats)
	f.counter("prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
		func(s *engine.Stats) float64 { return float64(s.PrefixHits) }, stats)
	f.counter("external_prefix_cache_queries_total", "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.",
		func(s *engine.Stats) float64 { return float64(s.CPUQueries) }, stats)
	f.counter("external_prefix_cache_hits_total", "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.",
		func(s *engine.Stats) float64 { return float64(s.CPUHits) }, stats)
	f.counter("num_preemptions_total", "Cumulative number of preemption from the engine.",
		func(s *engine.Stats) float64 { return float64(s.Preemptions) }, stats)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig.",
		ConstLabels: prometheus.Labels{
			"block_size":             strconv.Itoa(ec.BlockSize),
			"num_gpu_blocks":         strconv.Itoa(ec.NumBlocks),
			"num_cpu_blocks":         strconv.Itoa(ec.CPUBlocks),
			"enable_prefix_caching":  "True",
			"cache_dtype":            "auto",
			"gpu_memory_utilization": "0.9",
			"engine":                 "0",
		},
	}, func() float64 { return 1 }))
	return &metrics{
		ttft:       f.histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets),
		itl:        f.histogram("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itlBuckets),
		e2e:        f.histogram("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", requestBuckets),
		queue:      f.histogram("request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", requestBuckets),
		prompt:     f.plainCounter("prompt_tokens_total", "Number of prefill tokens processed."),
		generation: f.plainCounter("generation_tokens_total", "Number of generation tokens processed."),
		requests:   f.plainCounter("request_success_total", "Count of successfully processed requests."),
	}
}

func sglangMetrics(reg prometheus.Registerer, model string, ec engine.Config, stats func() *engine.Stats) *metrics {
	f := factory{reg: reg, ns: "sglang:", labels: prometheus.Labels{"model_name": model}}
	f.gauge("num_running_reqs", "The number of running requests.",
		func(s *engine.Stats) float64 { return float64(s.Running) }, stats)
	f.gauge("num_queue_reqs", "The number of requests in the waiting queue.",
		func(s *engine.Stats) float64 { return float64(s.Waiting) }, stats)
	f.gauge("token_usage", "The token usage.", kvUsage, stats)
	f.gauge("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.",
		func(*engine.Stats) float64 { return float64(ec.NumBlocks * ec.BlockSize) }, stats)
	f.gauge("cache_hit_rate", "The prefix cache hit rate.", func(s *engine.Stats) float64 {
		if s.PrefixQueries == 0 {
			return 0
		}
		return float64(s.PrefixHits) / float64(s.PrefixQueries)
	}, stats)
	f.counter("cached_tokens_total", "Number of cached prompt tokens.",
		func(s *engine.Stats) float64 { return float64(s.PrefixHits) }, stats)
	f.counter("num_retracted_reqs_total", "The number of retracted (preempted) requests.",
		func(s *engine.Stats) float64 { return float64(s.Preemptions) }, stats)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sglang:cache_config_info", Help: "Cache configuration information.",
		ConstLabels: prometheus.Labels{
			"model_name": model,
			"page_size":  strconv.Itoa(ec.BlockSize),
			"num_pages":  strconv.Itoa(ec.NumBlocks),
		},
	}, func() float64 { return 1 }))
	return &metrics{
		ttft:       f.histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets),
		itl:        f.histogram("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itlBuckets),
		e2e:        f.histogram("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", requestBuckets),
		queue:      f.histogram("queue_time_seconds", "Histogram of queueing time in seconds.", requestBuckets),
		prompt:     f.plainCounter("prompt_tokens_total", "Number of prefill tokens processed."),
		generation: f.plainCounter("generation_tokens_total", "Number of generation tokens processed."),
		requests:   f.plainCounter("num_requests_total", "Number of requests processed."),
	}
}

func kvUsage(s *engine.Stats) float64 {
	if s.TotalBlocks == 0 {
		return 0
	}
	return float64(s.UsedBlocks) / float64(s.TotalBlocks)
}

// observeDone records a finished request. Called by the engine goroutine.
func (m *metrics) observeDone(ev *engine.Event) {
	if ev.Canceled {
		return
	}
	m.ttft.Observe((ev.First - ev.Arrived).Seconds())
	m.e2e.Observe((ev.At - ev.Arrived).Seconds())
	m.queue.Observe((ev.Started - ev.Arrived).Seconds())
	m.prompt.Add(float64(ev.PromptTokens))
	m.generation.Add(float64(ev.OutputTokens))
	m.requests.Inc()
}

// factory registers instruments with a name prefix and constant labels.
type factory struct {
	reg    prometheus.Registerer
	ns     string
	labels prometheus.Labels
}

func (f factory) gauge(name, help string, v func(*engine.Stats) float64, stats func() *engine.Stats) {
	f.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: f.ns + name, Help: help, ConstLabels: f.labels,
	}, func() float64 { return v(stats()) }))
}

// counter registers a counter read from the stats snapshot; name ends in
// _total, which client_golang keeps as is.
func (f factory) counter(name, help string, v func(*engine.Stats) float64, stats func() *engine.Stats) {
	f.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: f.ns + name, Help: help, ConstLabels: f.labels,
	}, func() float64 { return v(stats()) }))
}

func (f factory) plainCounter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: f.ns + name, Help: help, ConstLabels: f.labels})
	f.reg.MustRegister(c)
	return c
}

func (f factory) histogram(name, help string, buckets []float64) prometheus.Histogram {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: f.ns + name, Help: help, Buckets: buckets, ConstLabels: f.labels,
	})
	f.reg.MustRegister(h)
	return h
}

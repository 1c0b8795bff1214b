package emulator

import (
	"encoding/json"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/engine"
)

// An engine of a llama.cpp preset (engine.KindLlamaCpp) is served as
// llama-server shows itself to a router: its metrics are llama.cpp's
// (llamacpp:*, whatever MetricsFlavor says) and GET /slots lists its
// slots with their context, so that kvrouter detects it and models its
// slots as it does a real one's. Its other endpoints stay the
// emulator's (OpenAI's API, vLLM's /tokenize).

// llamaCppMetrics registers llama-server's metrics (tools/server,
// server-context.cpp, handle_metrics) of the stats: the prompt tokens it
// computed and those it reused, the tokens it generated, its requests
// processing and deferred. The latency histograms llama-server does not
// have are kept off the page, on a registry nobody reads.
func llamaCppMetrics(reg prometheus.Registerer, stats func() *engine.Stats) *metrics {
	f := factory{reg: reg, ns: "llamacpp:"}
	f.counter("prompt_tokens_total", "Number of prompt tokens processed.",
		func(s *engine.Stats) float64 { return float64(s.PrefixQueries - s.PrefixHits) }, stats)
	f.counter("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache.",
		func(s *engine.Stats) float64 { return float64(s.PrefixHits) }, stats)
	f.counter("tokens_predicted_total", "Number of generation tokens processed.",
		func(s *engine.Stats) float64 { return float64(s.OutputTokens) }, stats)
	f.gauge("requests_processing", "Number of requests processing.",
		func(s *engine.Stats) float64 { return float64(s.Running) }, stats)
	f.gauge("requests_deferred", "Number of requests deferred.",
		func(s *engine.Stats) float64 { return float64(s.Waiting) }, stats)
	hidden := factory{reg: prometheus.NewRegistry(), ns: "emulator_llamacpp_"}
	return &metrics{
		ttft:       hidden.histogram("ttft_seconds", "", ttftBuckets),
		itl:        hidden.histogram("itl_seconds", "", itlBuckets),
		e2e:        hidden.histogram("e2e_seconds", "", requestBuckets),
		queue:      hidden.histogram("queue_seconds", "", requestBuckets),
		prompt:     hidden.plainCounter("prompt_tokens_total", ""),
		generation: hidden.plainCounter("generation_tokens_total", ""),
		requests:   hidden.plainCounter("requests_total", ""),
	}
}

// slots answers GET /slots as llama-server does: one entry per slot, its
// id, context and whether it runs a request (the engine's running
// requests fill the first slots: the emulator does not say which).
func (s *Server) slots(w http.ResponseWriter, r *http.Request) {
	type slot struct {
		ID           int  `json:"id"`
		NCtx         int  `json:"n_ctx"`
		IsProcessing bool `json:"is_processing"`
	}
	n := s.ecfg.MaxNumSeqs
	running := s.stats.Load().Running
	out := make([]slot, n)
	for i := range out {
		out[i] = slot{ID: i, NCtx: s.ecfg.NumBlocks * s.ecfg.BlockSize / n, IsProcessing: i < running}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

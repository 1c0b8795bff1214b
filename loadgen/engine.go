package loadgen

import (
	"context"
	"fmt"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// EngineFigures are what an engine reports about itself on /metrics (vLLM
// names, or SGLang's where they exist), summed over label sets. They are
// the ground truth a client's measurements are checked against.
type EngineFigures struct {
	// PrefixQueries and PrefixHits are prompt tokens looked up in the
	// prefix cache and found there (vllm:prefix_cache_queries_total,
	// vllm:prefix_cache_hits_total; SGLang: prompt_tokens_total,
	// cached_tokens_total).
	PrefixQueries, PrefixHits float64
	// TTFTSum and TTFTCount are the time-to-first-token histogram's sum (in
	// the engine's seconds: model time for an emulated replica) and count.
	TTFTSum   float64
	TTFTCount uint64
	// Requests is the number of finished requests
	// (vllm:request_success_total, sglang:num_requests_total).
	Requests float64
}

// HitRate is PrefixHits / PrefixQueries, 0..1 (zero without queries).
func (f EngineFigures) HitRate() float64 {
	if f.PrefixQueries == 0 {
		return 0
	}
	return f.PrefixHits / f.PrefixQueries
}

// MeanTTFT is TTFTSum / TTFTCount as a duration (zero without samples).
func (f EngineFigures) MeanTTFT() time.Duration {
	if f.TTFTCount == 0 {
		return 0
	}
	return time.Duration(f.TTFTSum / float64(f.TTFTCount) * float64(time.Second))
}

// Add returns the sum of f and g (a fleet's figures from its replicas').
func (f EngineFigures) Add(g EngineFigures) EngineFigures {
	return EngineFigures{
		PrefixQueries: f.PrefixQueries + g.PrefixQueries, PrefixHits: f.PrefixHits + g.PrefixHits,
		TTFTSum: f.TTFTSum + g.TTFTSum, TTFTCount: f.TTFTCount + g.TTFTCount,
		Requests: f.Requests + g.Requests,
	}
}

// ScrapeEngine reads base+"/metrics" and returns the engine's figures.
func ScrapeEngine(ctx context.Context, c *http.Client, base string) (EngineFigures, error) {
	var f EngineFigures
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return f, fmt.Errorf("scrape %s: %w", base, err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return f, fmt.Errorf("scrape %s: %w", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return f, fmt.Errorf("scrape %s: status %d", base, resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		return f, fmt.Errorf("scrape %s: %w", base, err)
	}
	f.PrefixQueries = counter(fams, "vllm:prefix_cache_queries") + counter(fams, "sglang:prompt_tokens")
	f.PrefixHits = counter(fams, "vllm:prefix_cache_hits") + counter(fams, "sglang:cached_tokens")
	f.Requests = counter(fams, "vllm:request_success") + counter(fams, "sglang:num_requests")
	for _, name := range []string{"vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"} {
		if fam, ok := fams[name]; ok {
			for _, m := range fam.Metric {
				if h := m.GetHistogram(); h != nil {
					f.TTFTSum += h.GetSampleSum()
					f.TTFTCount += h.GetSampleCount()
				}
			}
		}
	}
	return f, nil
}

// counter sums the family name, with or without the _total suffix.
func counter(fams map[string]*dto.MetricFamily, name string) float64 {
	var v float64
	for _, n := range []string{name, name + "_total"} {
		fam, ok := fams[n]
		if !ok {
			continue
		}
		for _, m := range fam.Metric {
			switch {
			case m.Counter != nil:
				v += m.Counter.GetValue()
			case m.Gauge != nil:
				v += m.Gauge.GetValue()
			case m.Untyped != nil:
				v += m.Untyped.GetValue()
			}
		}
	}
	return v
}

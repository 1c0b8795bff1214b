package emulator

import (
	"fmt"
	"net/http"
	"testing"

	routerscrape "github.com/kvrouter/kvrouter/scrape"
)

// TestCPUTier runs a replica whose GPU cache holds 12 blocks and whose CPU
// tier 100: a prompt evicted from the GPU by another comes back from the
// CPU tier, and the engine says so in its usage, its KV events (medium
// "CPU") and its metrics (vLLM's external prefix-cache counters).
func TestCPUTier(t *testing.T) {
	cfg := zmqConfig(FormatMap)
	cfg.KVBlocks, cfg.CPUKVBlocks = 12, 100
	s := start(t, cfg)
	c := subscribe(t, s)
	prompt := func(from, blocks int) []uint32 {
		p := make([]uint32, blocks*16+3)
		for i := range p {
			p[i] = uint32(from + i)
		}
		return p
	}
	complete := func(p []uint32) int {
		code, b := post(t, s.URL()+"/v1/completions", map[string]any{"prompt": p, "max_tokens": 2})
		if code != 200 {
			t.Fatalf("status %d: %s", code, b)
		}
		return decodeResponse(t, b).Usage.PromptTokensDetails.CachedTokens
	}
	complete(prompt(1000, 5))
	complete(prompt(5000, 9)) // 10 blocks: evicts 4 of the first prompt's 5
	if got := complete(prompt(1000, 5)); got != 80 {
		t.Errorf("the first prompt again: %d cached tokens, want 80 (5 blocks, GPU and CPU)", got)
	}
	_, evs := collect(t, c, FormatMap, func(e []kvEvent) bool {
		n := 0
		for _, ev := range e {
			if ev.Type == "BlockStored" && ev.Medium == "CPU" {
				n += len(ev.Hashes)
			}
		}
		return n >= 5+9
	})
	for _, ev := range evs {
		if ev.Medium != "GPU" && ev.Medium != "CPU" {
			t.Errorf("event %s on medium %q", ev.Type, ev.Medium)
		}
	}
	fams := scrape(t, s.URL())
	hits := metric(t, fams, "vllm:external_prefix_cache_hits_total")
	gpu := metric(t, fams, "vllm:prefix_cache_hits_total")
	if hits <= 0 || hits+gpu != 80 {
		t.Errorf("external hits %v and GPU hits %v, want both to add up to the 80 cached tokens", hits, gpu)
	}
	if q := metric(t, fams, "vllm:external_prefix_cache_queries_total"); q < hits {
		t.Errorf("external queries %v < hits %v", q, hits)
	}
}

// TestScrapeOfATier: what the router's scrape reads of an engine with a
// CPU tier, from its real /metrics: the GPU and CPU geometry (the CPU
// tier counts, since the engine reports a KV connector's prefix-cache
// queries) and the generated tokens, the figures the simulator's scrape
// of the same engine model reports.
func TestScrapeOfATier(t *testing.T) {
	s := start(t, Config{KVBlocks: 1000, CPUKVBlocks: 4000})
	for k := range 3 {
		if code, b := post(t, s.URL()+"/v1/completions", map[string]any{"prompt": words(fmt.Sprint("st", k), 50), "max_tokens": 5, "ignore_eos": true}); code != 200 {
			t.Fatalf("status %d: %s", code, b)
		}
	}
	resp, err := http.Get(s.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	l, err := routerscrape.Parse(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if l.NumBlocks != 1000 || l.CPUBlocks != 4000 || l.GenerationTokens != 15 {
		t.Errorf("scraped %d GPU blocks, %d CPU blocks, %g generated tokens; want 1000, 4000, 15", l.NumBlocks, l.CPUBlocks, l.GenerationTokens)
	}
}

// Package scrape reads engine load signals from each replica's Prometheus
// /metrics endpoint: running and waiting requests, KV-cache usage, cache
// geometry and prefix-cache counters, in vLLM's, SGLang's and llama.cpp's
// metric names (engine.go).
//
// Parse is a pure function over the Prometheus text format (parsed with
// github.com/prometheus/common/expfmt, not string matching), of the lines
// of the families it reads: the others (an engine's latency histograms,
// most of a response) are skipped by name, unparsed. Scraper runs
// one polling loop per replica, with a per-replica offset so loops do not
// align, and tracks staleness. ListModels reads a replica's model list
// (GET /v1/models: base models and LoRA adapters), which the Scraper polls
// in a second loop per replica.
//
// Metric names follow vLLM v1 (vllm/v1/metrics/loggers.py), SGLang
// (python/sglang/srt/metrics/collector.py) and llama.cpp's llama-server
// (tools/server/server-task.cpp, server_task_result_metrics::to_metrics).
package scrape

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"strconv"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Load is one replica's engine state as read from one scrape. Counts are
// summed over label sets (several engines or data-parallel ranks behind one
// endpoint).
type Load struct {
	// Running is the number of requests in the engine's running batch.
	Running int
	// Waiting is the number of requests queued and not yet scheduled.
	Waiting int
	// KVUsage is the fraction of KV-cache blocks in use, 0..1 (the mean over
	// engines when there are several).
	KVUsage float64
	// BlockSize is the engine's tokens per KV block (SGLang's page size);
	// zero when the engine does not report it.
	BlockSize int
	// NumBlocks is the engine's KV capacity in blocks of BlockSize tokens,
	// summed over engines; zero when not reported.
	NumBlocks int
	// CPUBlocks is the engine's CPU tier in blocks of BlockSize tokens
	// (vLLM's cache_config_info num_cpu_blocks, summed over engines),
	// where blocks evicted from the GPU stay loadable; zero when it has
	// none or does not say.
	CPUBlocks int
	// PrefixQueries and PrefixHits are the engine's cumulative prefix-cache
	// counters, in tokens: prompt tokens looked up, and those found cached.
	PrefixQueries, PrefixHits float64
	// ExternalHits is the engine's cumulative count of prompt tokens its
	// KV connectors served (vllm:external_prefix_cache_hits: a CPU tier's
	// loads, a peer's transfers), which its GPU counted as misses; zero
	// without a connector.
	ExternalHits float64
	// GenerationTokens is the engine's cumulative count of generated
	// tokens (vllm:generation_tokens_total, sglang:generation_tokens_total):
	// their KV takes blocks from the cache as prompt misses do.
	GenerationTokens float64
	// Engine is the engine whose metric families the page had: EngineVLLM,
	// EngineSGLang or EngineLlamaCpp; empty when it had none that Parse
	// knows (the load then reads as idle and unknown).
	Engine string
	// Slots is a llama.cpp replica's slot count (the requests it runs at
	// once, GET /slots) and SlotContext each slot's context in tokens;
	// zero for other engines and before /slots was read.
	Slots, SlotContext int
	// At is when the scrape completed, Asked when it was sent: the
	// engine's figures are of some moment between. Parse leaves both
	// zero; a zero Asked means At.
	At, Asked time.Time
}

// Names of the metrics Parse reads. Counters are looked up both with and
// without the _total suffix, since Python's client names the family either
// way depending on its version.
const (
	vllmRunning     = "vllm:num_requests_running"
	vllmWaiting     = "vllm:num_requests_waiting"
	vllmKVUsage     = "vllm:kv_cache_usage_perc"
	vllmGPUUsage    = "vllm:gpu_cache_usage_perc" // before vLLM 0.10
	vllmCacheConfig = "vllm:cache_config_info"
	vllmQueries     = "vllm:prefix_cache_queries"
	vllmHits        = "vllm:prefix_cache_hits"
	vllmGenerated   = "vllm:generation_tokens"
	// vllmExtQueries is vLLM's count of the prompt tokens a KV connector
	// was asked for (an offload tier, LMCache, a peer): present only when
	// the engine has one.
	vllmExtQueries = "vllm:external_prefix_cache_queries"
	// vllmExtHits is the part of those the connector served.
	vllmExtHits = "vllm:external_prefix_cache_hits"

	sglRunning     = "sglang:num_running_reqs"
	sglWaiting     = "sglang:num_queue_reqs"
	sglUsage       = "sglang:token_usage"
	sglCacheConfig = "sglang:cache_config_info"
	sglMaxTokens   = "sglang:max_total_num_tokens"
	sglPrompt      = "sglang:prompt_tokens"
	sglCached      = "sglang:cached_tokens"
	sglGenerated   = "sglang:generation_tokens"
)

// Parse reads one /metrics response in the Prometheus text format and
// extracts the load signals of vLLM or SGLang. Metrics it does not know are
// ignored, unparsed: only the lines of the families it reads (kept) are
// parsed, so that a scrape costs what those few lines cost. An input with
// none of the known metrics is not an error (the Load is zero). Malformed
// text in the lines it reads is an error.
func Parse(r io.Reader) (Load, error) {
	kp := texts.Get().(*[]byte)
	defer putText(kp)
	if err := readKept(kp, r); err != nil {
		return Load{}, err
	}
	return parseKept(*kp)
}

// memo parses one replica's pages and keeps the last page's kept lines
// and Load, so that a page whose kept lines did not change since (an idle
// engine's, whatever its other families do) is not parsed again. Its zero
// value is ready; it is not safe for concurrent use.
type memo struct {
	kept []byte
	load Load
	ok   bool // kept and load are a page's
}

// parse reads a page from r as Parse does; changed is false when its kept
// lines are the last page's, whose Load it then returns unparsed. A page
// that does not parse forgets the last one.
func (m *memo) parse(r io.Reader) (l Load, changed bool, err error) {
	kp := texts.Get().(*[]byte)
	defer putText(kp)
	if err := readKept(kp, r); err != nil {
		return Load{}, true, err
	}
	if m.ok && bytes.Equal(m.kept, *kp) {
		return m.load, false, nil
	}
	m.ok = false
	if l, err = parseKept(*kp); err != nil {
		return Load{}, true, err
	}
	m.kept, m.load, m.ok = append(m.kept[:0], *kp...), l, true
	return l, true, nil
}

// readKept reads what r yields and sets *kp to its kept lines.
func readKept(kp *[]byte, r io.Reader) error {
	bp := texts.Get().(*[]byte)
	defer putText(bp)
	in, err := readAll(r, (*bp)[:0])
	*bp = in
	if err != nil {
		return fmt.Errorf("parse metrics: %w", err)
	}
	*kp = kept((*kp)[:0], in)
	return nil
}

// parseKept parses the kept lines of a page.
func parseKept(k []byte) (Load, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(k))
	if err != nil {
		return Load{}, fmt.Errorf("parse metrics: %w", err)
	}
	return loadOf(fams)
}

// loadOf extracts the load signals from the parsed families.
func loadOf(fams map[string]*dto.MetricFamily) (Load, error) {
	s := make(series, len(known))
	for _, name := range known {
		f, ok := fams[name]
		if !ok {
			continue
		}
		v, err := expfmt.ExtractSamples(&expfmt.DecodeOptions{}, f)
		if err != nil {
			return Load{}, fmt.Errorf("parse metrics: %s: %w", name, err)
		}
		s[name] = v
	}
	var l Load
	l.Engine = s.engine()
	l.Running = int(s.sum(vllmRunning) + s.sum(sglRunning) + s.sum(lcppProcessing))
	l.Waiting = int(s.sum(vllmWaiting) + s.sum(sglWaiting) + s.sum(lcppDeferred))
	l.KVUsage = s.usage()
	l.BlockSize, l.NumBlocks = s.geometry()
	if s.has(vllmExtQueries) {
		// num_cpu_blocks is a CPU tier that serves prefixes only behind a
		// KV connector; without one (vLLM v0) it is swap space for
		// preempted requests, which serves no prefix.
		_, l.CPUBlocks = s.info(vllmCacheConfig, "block_size", "num_cpu_blocks")
		l.ExternalHits = s.counter(vllmExtHits)
	}
	l.PrefixQueries = s.counter(vllmQueries) + s.counter(sglPrompt)
	l.PrefixHits = s.counter(vllmHits) + s.counter(sglCached)
	l.GenerationTokens = s.counter(vllmGenerated) + s.counter(sglGenerated)
	// llama.cpp counts the prompt tokens it processed apart from those it
	// reused: looked up is their sum.
	l.PrefixQueries += s.counter(lcppPrompt) + s.counter(lcppCached)
	l.PrefixHits += s.counter(lcppCached)
	l.GenerationTokens += s.counter(lcppPredicted)
	return l, nil
}

// known lists the families Parse extracts.
var known = [...]string{
	vllmRunning, vllmWaiting, vllmKVUsage, vllmGPUUsage, vllmCacheConfig,
	vllmQueries, vllmQueries + "_total", vllmHits, vllmHits + "_total",
	vllmGenerated, vllmGenerated + "_total", vllmExtQueries, vllmExtQueries + "_total", vllmExtHits, vllmExtHits + "_total",
	sglRunning, sglWaiting, sglUsage, sglCacheConfig, sglMaxTokens,
	sglPrompt, sglPrompt + "_total", sglCached, sglCached + "_total",
	sglGenerated, sglGenerated + "_total",
	lcppProcessing, lcppDeferred, lcppPrompt, lcppPrompt + "_total", lcppCached, lcppCached + "_total",
	lcppPredicted, lcppPredicted + "_total",
}

// has reports whether the counter family name (with or without _total)
// was in the scrape.
func (s series) has(name string) bool {
	_, a := s[name]
	_, b := s[name+"_total"]
	return a || b
}

// series holds the samples of the known families, by family name.
type series map[string]model.Vector

// sum adds the values of every sample of a family; zero if absent. NaN and
// infinite samples count as zero.
func (s series) sum(name string) float64 {
	var t float64
	for _, v := range s[name] {
		f := float64(v.Value)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			continue
		}
		t += f
	}
	return t
}

// counter sums a counter family found under name_total or name.
func (s series) counter(name string) float64 {
	if _, ok := s[name+"_total"]; ok {
		return s.sum(name + "_total")
	}
	return s.sum(name)
}

// mean averages a family's samples; ok is false if it is absent or empty.
func (s series) mean(name string) (float64, bool) {
	if len(s[name]) == 0 {
		return 0, false
	}
	return s.sum(name) / float64(len(s[name])), true
}

// usage is the KV usage fraction, clamped to 0..1.
func (s series) usage() float64 {
	u, ok := s.mean(vllmKVUsage)
	if !ok {
		u, ok = s.mean(vllmGPUUsage)
	}
	if !ok {
		u, _ = s.mean(sglUsage)
	}
	return min(max(u, 0), 1)
}

// geometry reads block size and block count from the info metrics, summing
// the block count over samples (one per engine). SGLang without num_pages
// falls back to max_total_num_tokens divided by the page size (1 if unknown).
func (s series) geometry() (blockSize, numBlocks int) {
	if bs, n := s.info(vllmCacheConfig, "block_size", "num_gpu_blocks"); n > 0 && bs > 0 {
		return bs, n
	}
	bs, n := s.info(sglCacheConfig, "page_size", "num_pages")
	if n > 0 && bs > 0 {
		return bs, n
	}
	if tokens := s.sum(sglMaxTokens); tokens >= 1 && tokens < 1<<40 {
		bs = max(bs, 1)
		return bs, int(tokens) / bs
	}
	return 0, 0
}

// info reads two integer labels of an info metric (value 1, data in
// labels): the size from any sample, the count summed over samples. Labels
// that are missing or not positive integers ("None") count as zero.
func (s series) info(name, sizeLabel, countLabel string) (size, count int) {
	for _, v := range s[name] {
		if n := label(v.Metric, sizeLabel); n > 0 {
			size = n
		}
		count += label(v.Metric, countLabel)
	}
	return size, count
}

// label returns a positive integer label, or zero.
func label(m model.Metric, name string) int {
	n, err := strconv.Atoi(string(m[model.LabelName(name)]))
	if err != nil || n <= 0 || n > 1<<40 {
		return 0
	}
	return n
}

// knownName holds the families Parse extracts, and with them the
// suffixes a histogram's or summary's samples take, for kept.
var knownName = func() map[string]bool {
	m := make(map[string]bool, 4*len(known))
	for _, name := range known {
		for _, suffix := range [...]string{"", "_bucket", "_sum", "_count"} {
			m[name+suffix] = true
		}
	}
	return m
}()

// kept appends to dst the lines of text that Parse reads: the samples,
// HELP and TYPE lines of the known families, and every line whose name it
// cannot tell without parsing it (a quoted UTF-8 name); the other
// families' lines and other comments, which the text format ignores, are
// left out.
func kept(dst, text []byte) []byte {
	for len(text) > 0 {
		line := text
		if i := bytes.IndexByte(text, '\n'); i >= 0 {
			line = text[:i+1]
		}
		text = text[len(line):]
		if name, ok := lineName(line); !ok || knownName[string(name)] {
			dst = append(dst, line...)
		}
	}
	return dst
}

// lineName returns the metric name a line of the text format is about:
// a sample's, or a HELP or TYPE comment's. ok is false for a line whose
// name cannot be read without parsing (a quoted name), which Parse keeps;
// a blank line and another comment have an empty name, which no known
// family has.
func lineName(line []byte) (name []byte, ok bool) {
	line = skipBlank(line)
	if len(line) > 0 && line[0] == '#' {
		rest := skipBlank(line[1:])
		word := rest[:nameEnd(rest)]
		if string(word) != "HELP" && string(word) != "TYPE" {
			return nil, true // a comment: ignored by the format
		}
		line = skipBlank(rest[len(word):])
	}
	if len(line) > 0 && (line[0] == '"' || line[0] == '{') {
		return nil, false
	}
	return line[:nameEnd(line)], true
}

// skipBlank returns b without its leading blanks and tabs.
func skipBlank(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

// nameEnd returns where the name at the start of b ends: at a brace, a
// blank or the line's end.
func nameEnd(b []byte) int {
	for i, c := range b {
		switch c {
		case '{', ' ', '\t', '\n', '\r':
			return i
		}
	}
	return len(b)
}

// texts pools the buffers Parse reads a response and its kept lines
// into; putText drops one past maxPooledText.
var texts = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledText caps the buffers texts keeps.
const maxPooledText = 1 << 20

func putText(b *[]byte) {
	if cap(*b) <= maxPooledText {
		*b = (*b)[:0]
		texts.Put(b)
	}
}

// readAll appends what r yields to buf until EOF.
func readAll(r io.Reader, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

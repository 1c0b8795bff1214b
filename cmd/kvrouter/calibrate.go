package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/scrape"
)

var calibrateHelp = help{
	synopsis: "kvrouter calibrate --backend URL [flags]",
	about: "Measures a live engine's prefill and decode speed with a few requests, one at a\n" +
		"time, and writes a preset file for --preset-file of sim, plan, engine and serve.\n" +
		"Times are the engine's own: the time to first token less the queue time, and the\n" +
		"inter-token latency, from its /metrics histograms (vLLM, SGLang, kvrouter engine),\n" +
		"or the timings of its answers (llama.cpp); the wall clock is never used. The\n" +
		"prefill of fresh prompts of several lengths fits step-overhead, prefill-per-token\n" +
		"and attn-per-mpairs; a long output at batch one gives decode-step (the base\n" +
		"preset's decode-per-seq and decode-per-mtokens kept). The KV geometry comes from\n" +
		"the engine's cache_config_info when it has one; a llama.cpp engine's preset is\n" +
		"a llamacpp one of its slots and context (/slots). Run it on an idle engine.",
	examples: []string{
		"kvrouter calibrate --backend http://127.0.0.1:8001 --out my-engine.yaml",
		"kvrouter calibrate --backend http://127.0.0.1:8001 --base qwen3-32b-2xh100 --sizes 256,1024,4096  # then kvrouter sim --preset-file my-engine.yaml",
	},
}

func runCalibrate(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("calibrate", flag.ContinueOnError)
	backend := fs.String("backend", "", "engine base URL (required)")
	modelName := fs.String("model", "", "model name; empty: the first one /v1/models lists")
	base := fs.String("base", engine.DefaultPreset, "built-in preset the file starts from (what is not measured): "+strings.Join(engine.Presets(), ", "))
	out := fs.String("out", "", "write the preset file here (.yaml or .yml); empty: standard output")
	sizes := fs.String("sizes", "128,512,1024,2048", "prompt lengths to prefill, in words (about a token each), comma-separated: at least three")
	repeats := fs.Int("repeats", 2, "requests per prompt length")
	decodeTokens := fs.Int("decode-tokens", 64, "output tokens of the decode measurement")
	timeout := fs.Duration("timeout", time.Minute, "per-request timeout")
	if err := parseFlags(fs, args, calibrateHelp, os.Stderr); err != nil {
		return err
	}
	if *backend == "" {
		return &usageError{cmd: "calibrate", err: errors.New("--backend is required")}
	}
	if *out != "" && !engine.IsPresetFile(*out) {
		return &usageError{cmd: "calibrate", err: fmt.Errorf("--out %s: want a .yaml or .yml file", *out)}
	}
	words, err := parseSizes(*sizes)
	if err != nil || *repeats < 1 || *decodeTokens < 8 {
		return &usageError{cmd: "calibrate", err: fmt.Errorf("--sizes (%v), --repeats >= 1, --decode-tokens >= 8", err)}
	}
	baseCfg, err := engine.Preset(*base)
	if err != nil {
		return &usageError{cmd: "calibrate", err: err}
	}
	cb := calibrator{url: strings.TrimRight(*backend, "/"), model: *modelName, client: &http.Client{Timeout: *timeout}}
	pf, err := cb.run(ctx, *base, baseCfg, words, *repeats, *decodeTokens)
	if err != nil {
		return err
	}
	b, err := yaml.Marshal(pf)
	if err != nil {
		return err
	}
	b = append([]byte(fmt.Sprintf("# kvrouter calibrate --backend %s (%s)\n", cb.url, cb.source)), b...)
	if *out == "" {
		_, err = os.Stdout.Write(b)
		return err
	}
	return os.WriteFile(*out, b, 0o644)
}

// parseSizes reads --sizes: at least three distinct positive lengths.
func parseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(f), &n); err != nil || n < 1 || n > 1<<20 {
			return nil, fmt.Errorf("size %q: want a positive count", f)
		}
		out = append(out, n)
	}
	if len(out) < 3 {
		return nil, errors.New("want at least three sizes")
	}
	return out, nil
}

// calibrator measures one engine.
type calibrator struct {
	url, model string
	client     *http.Client
	source     string // where the times came from, for the file's comment
	nonce      int
}

// timing is one request's engine-measured times.
type timing struct {
	prefill time.Duration // first token less queue time
	decode  time.Duration // mean time per output token after the first
	n       int           // prompt tokens computed (prompt less cached)
	outputs int
}

// run measures and returns the preset file.
func (cb *calibrator) run(ctx context.Context, baseName string, base engine.Config, words []int, repeats, decodeTokens int) (engine.PresetFile, error) {
	if cb.model == "" {
		m, err := cb.firstModel(ctx)
		if err != nil {
			return engine.PresetFile{}, err
		}
		cb.model = m
	}
	var xs []float64
	var ys []float64
	for _, w := range words {
		for range repeats {
			t, err := cb.measure(ctx, w, 1)
			if err != nil {
				return engine.PresetFile{}, err
			}
			xs, ys = append(xs, float64(t.n)), append(ys, float64(t.prefill))
		}
	}
	fit, err := fitPrefill(xs, ys)
	if err != nil {
		return engine.PresetFile{}, err
	}
	c := base
	c.StepOverhead = time.Duration(fit[0])
	c.PrefillPerToken = time.Duration(math.Round(fit[1]))
	c.AttnPerMPairs = time.Duration(2e6 * fit[2])
	t, err := cb.measure(ctx, 16, decodeTokens)
	if err != nil {
		return engine.PresetFile{}, err
	}
	ctxTokens := int64(t.n + t.outputs/2)
	c.DecodeStep = max(0, t.decode-c.StepOverhead-c.DecodePerSeq-time.Duration(ctxTokens*int64(c.DecodePerMTokens)/1e6))
	l, err := cb.load(ctx)
	switch {
	case err == nil && l.Engine == scrape.EngineLlamaCpp:
		if err := cb.slots(ctx, &c); err != nil {
			return engine.PresetFile{}, err
		}
	case err == nil && l.BlockSize > 0 && l.NumBlocks > 0:
		c.BlockSize, c.NumBlocks = l.BlockSize, l.NumBlocks
	}
	return engine.PresetFileOf(baseName, c), nil
}

// llamaBlockSize is the block size of a llama.cpp preset: the granularity
// at which the model compares prompts (llama.cpp reuses to the token;
// a block of 4 loses 2 tokens per prompt on average).
const llamaBlockSize = 4

// slots makes c a llama.cpp engine of the backend's slots and context
// (GET /slots): MaxNumSeqs slots of n_ctx tokens each, llama-server's
// batch of 2048 tokens, its default slot similarity and host prompt
// cache (8 GiB of the base preset's KV bytes per token).
func (cb *calibrator) slots(ctx context.Context, c *engine.Config) error {
	n, nCtx, err := scrape.Slots(ctx, func(ctx context.Context, url string) (io.ReadCloser, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return nil, err
		}
		b, err := cb.do(req)
		return io.NopCloser(bytes.NewReader(b)), err
	}, cb.url)
	if err != nil {
		return fmt.Errorf("llama.cpp's slots: %w", err)
	}
	c.Kind, c.MaxNumSeqs, c.MaxBatchedTokens = engine.KindLlamaCpp, n, 2048
	c.BlockSize, c.NumBlocks, c.MaxModelLen = llamaBlockSize, n*nCtx/llamaBlockSize, nCtx
	c.SlotSimilarity, c.HostCacheTokens = 0, 0 // the engine's defaults
	cb.source += fmt.Sprintf(", %d slots of %d tokens", n, nCtx)
	return nil
}

// fitPrefill fits y = a + b·x + c·x² by least squares, with a, b, c >= 0
// (c dropped, then a, when the fit would make them negative).
func fitPrefill(xs, ys []float64) ([3]float64, error) {
	for _, terms := range []int{3, 2} {
		f, ok := leastSquares(xs, ys, terms)
		if ok && f[0] >= 0 && f[1] > 0 && f[2] >= 0 {
			return f, nil
		}
	}
	// y = b·x: what a noisy engine (a loaded host) leaves.
	var xy, xx float64
	for i := range xs {
		xy, xx = xy+xs[i]*ys[i], xx+xs[i]*xs[i]
	}
	if xx > 0 && xy > 0 {
		return [3]float64{0, xy / xx, 0}, nil
	}
	return [3]float64{}, errors.New("the prefill times do not grow with the prompt: is the engine idle, and its prefix cache off for these prompts?")
}

// leastSquares solves the normal equations of y ≈ Σ f[k]·x^k, k < terms.
func leastSquares(xs, ys []float64, terms int) ([3]float64, bool) {
	var a [3][4]float64
	for i := range xs {
		p := [3]float64{1, xs[i], xs[i] * xs[i]}
		for r := range terms {
			for c := range terms {
				a[r][c] += p[r] * p[c]
			}
			a[r][3] += p[r] * ys[i]
		}
	}
	for col := range terms { // Gauss-Jordan with partial pivoting
		piv := col
		for r := col + 1; r < terms; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[piv][col]) {
				piv = r
			}
		}
		a[col], a[piv] = a[piv], a[col]
		if math.Abs(a[col][col]) < 1e-12 {
			return [3]float64{}, false
		}
		for r := range terms {
			if r == col {
				continue
			}
			k := a[r][col] / a[col][col]
			for c := col; c < 4; c++ {
				a[r][c] -= k * a[col][c]
			}
		}
	}
	var f [3]float64
	for k := range terms {
		f[k] = a[k][3] / a[k][k]
	}
	return f, true
}

// measure sends one completions request of a fresh prompt of words words
// and maxTokens output tokens, and returns the engine's own times of it:
// the answer's timings (llama.cpp), else the deltas of the engine's
// histograms over the request.
func (cb *calibrator) measure(ctx context.Context, words, maxTokens int) (timing, error) {
	before, err := cb.histograms(ctx)
	if err != nil {
		return timing{}, err
	}
	cb.nonce++
	var b strings.Builder
	fmt.Fprintf(&b, "calibrate %d %d.", time.Now().UnixNano(), cb.nonce) // a prefix no cache holds
	for i := range words {
		fmt.Fprintf(&b, " w%d", (i*7919+cb.nonce)%10000)
	}
	body, _ := json.Marshal(map[string]any{"model": cb.model, "prompt": b.String(), "max_tokens": maxTokens,
		"ignore_eos": true, "temperature": 0, "stream": false})
	var resp struct {
		Usage struct {
			PromptTokens        int `json:"prompt_tokens"`
			CompletionTokens    int `json:"completion_tokens"`
			PromptTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
		Timings *struct { // llama.cpp
			PromptN     int     `json:"prompt_n"`
			PromptMS    float64 `json:"prompt_ms"`
			PredictedN  int     `json:"predicted_n"`
			PredictedMS float64 `json:"predicted_ms"`
		} `json:"timings"`
	}
	if err := cb.post(ctx, "/v1/completions", body, &resp); err != nil {
		return timing{}, err
	}
	t := timing{n: resp.Usage.PromptTokens, outputs: resp.Usage.CompletionTokens}
	if d := resp.Usage.PromptTokensDetails; d != nil {
		t.n -= d.CachedTokens
	}
	if tm := resp.Timings; tm != nil && tm.PromptN > 0 {
		cb.source = "the answers' timings"
		t.n, t.prefill = tm.PromptN, time.Duration(tm.PromptMS*float64(time.Millisecond))
		if tm.PredictedN > 1 {
			t.decode = time.Duration(tm.PredictedMS / float64(tm.PredictedN) * float64(time.Millisecond))
		}
		return t, nil
	}
	after, err := cb.histograms(ctx)
	if err != nil {
		return timing{}, err
	}
	d := after.minus(before)
	if d.ttftCount != 1 {
		return timing{}, fmt.Errorf("%s: %g requests finished during the measurement, want 1: is the engine idle?", cb.url, d.ttftCount)
	}
	cb.source = "the engine's /metrics histograms"
	t.prefill = seconds(d.ttft - d.queue)
	if d.itlCount > 0 {
		t.decode = seconds(d.itl / d.itlCount)
	}
	if t.n < 1 {
		return timing{}, fmt.Errorf("%s: the answer says no prompt token was computed", cb.url)
	}
	return t, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// sums are the histogram sums and counts the calibration reads.
type sums struct {
	ttft, ttftCount, queue, itl, itlCount float64
}

func (a sums) minus(b sums) sums {
	return sums{a.ttft - b.ttft, a.ttftCount - b.ttftCount, a.queue - b.queue, a.itl - b.itl, a.itlCount - b.itlCount}
}

// maxMetricsBytes bounds a /metrics page read.
const maxMetricsBytes = 16 << 20

// histograms reads the engine's latency histograms: vLLM's names, or
// SGLang's (queue_time_seconds).
func (cb *calibrator) histograms(ctx context.Context) (sums, error) {
	page, err := cb.get(ctx, "/metrics")
	if err != nil {
		return sums{}, err
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(page))
	if err != nil {
		return sums{}, fmt.Errorf("%s/metrics: %w", cb.url, err)
	}
	var s sums
	read := func(name string, sum, count *float64) {
		for _, ns := range []string{"vllm:", "sglang:"} {
			if f, ok := fams[ns+name]; ok {
				for _, m := range f.GetMetric() {
					if h := m.GetHistogram(); h != nil {
						*sum += h.GetSampleSum()
						if count != nil {
							*count += float64(h.GetSampleCount())
						}
					}
				}
			}
		}
	}
	read("time_to_first_token_seconds", &s.ttft, &s.ttftCount)
	read("request_queue_time_seconds", &s.queue, nil)
	read("queue_time_seconds", &s.queue, nil)
	read("inter_token_latency_seconds", &s.itl, &s.itlCount)
	return s, nil
}

// load reads the engine's KV geometry from its metrics.
func (cb *calibrator) load(ctx context.Context) (scrape.Load, error) {
	page, err := cb.get(ctx, "/metrics")
	if err != nil {
		return scrape.Load{}, err
	}
	return scrape.Parse(bytes.NewReader(page))
}

// firstModel is the first model /v1/models lists.
func (cb *calibrator) firstModel(ctx context.Context) (string, error) {
	b, err := cb.get(ctx, "/v1/models")
	if err != nil {
		return "", err
	}
	var v struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &v); err != nil || len(v.Data) == 0 {
		return "", fmt.Errorf("%s/v1/models: no model listed (--model names one)", cb.url)
	}
	return v.Data[0].ID, nil
}

func (cb *calibrator) get(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cb.url+path, nil)
	if err != nil {
		return nil, err
	}
	return cb.do(req)
}

func (cb *calibrator) post(ctx context.Context, path string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cb.url+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	b, err := cb.do(req)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s%s: %w", cb.url, path, err)
	}
	return nil
}

// do sends req and reads the answer, at most maxMetricsBytes of it.
func (cb *calibrator) do(req *http.Request) ([]byte, error) {
	resp, err := cb.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxMetricsBytes+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("%s: %w", req.URL, err)
	case len(b) > maxMetricsBytes:
		return nil, fmt.Errorf("%s: answer larger than %d bytes", req.URL, maxMetricsBytes)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("%s: status %d: %.200s", req.URL, resp.StatusCode, b)
	}
	return b, nil
}

// Package demo runs kvrouter's live demonstration: N emulated vLLM
// replicas in process (real HTTP, SSE and ZMQ on loopback, time-scaled), the
// router in front of them, and the same workload (conversations, documents
// shared across sessions, a hot agent session) replayed through it once per
// routing policy, each policy on a cold fleet (new replicas, new router).
// It compares the policies by what the engines themselves report:
// usage.cached_tokens in every response, their own prefix-cache counters
// scraped at the end, and every request's timing on their model clocks,
// which a busy host does not stretch.
package demo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/emulator"
	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/loadgen"
	"github.com/kvrouter/kvrouter/proxy"
	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/trace"
)

// Defaults of Config.
const (
	DefaultReplicas  = 4
	DefaultRequests  = 240
	DefaultTimeScale = 0.1
	// BusyTimeScale is the time scale the demo runs at when Config.TimeScale
	// is zero and the host is busy (HostLag.Busy over a short probe): 4×
	// real time instead of 10×, giving the router, the replicas and the
	// client 2.5 times the wall time per model second.
	BusyTimeScale = 0.25
)

// DefaultPolicies are the policies the demo compares.
func DefaultPolicies() []string {
	return []string{"round-robin", "least-loaded", "session-hash", "kv-aware"}
}

// Config configures a demo run. The zero value runs the defaults.
type Config struct {
	// Replicas is the fleet size; zero means DefaultReplicas.
	Replicas int
	// Policies are run in order; nil means DefaultPolicies().
	Policies []string
	// Workload names the workload (ChatWorkload or a trace.Generate name);
	// empty means ChatWorkload.
	Workload string
	// Requests is the number of requests per policy; zero means
	// DefaultRequests.
	Requests int
	// TimeScale is wall seconds per model second for the replicas; zero
	// means DefaultTimeScale, or BusyTimeScale when a probe of the host
	// finds it busy (Result.Slowed). Smaller is faster but lets the
	// wall-clock overhead of HTTP weigh more in model time.
	TimeScale float64
	// Preset is the engine preset of the replicas and of the router's cost
	// model; empty means engine.DefaultPreset.
	Preset string
	// KVBlocks overrides each replica's KV capacity in blocks of 16 tokens;
	// zero keeps the preset's.
	KVBlocks int
	// Seed makes the workload reproducible.
	Seed uint64
	// NoSizing skips the closing sizing (Result.Sizing).
	NoSizing bool
	// Progress, if not nil, counts requests done and shows the policy.
	Progress *report.Progress
	// Logger receives the router's and replicas' warnings; nil discards.
	Logger *slog.Logger
}

// Result is a demo run's outcome.
type Result struct {
	// Config is the configuration after defaults.
	Config Config
	// Policies holds one entry per policy, in order.
	Policies []PolicyResult
	// Wall is the whole run's wall time.
	Wall time.Duration
	// Sizing is the fleet sizing on the same requests (the closing line);
	// nil when Config.NoSizing.
	Sizing *Sizing
	// Host is how late the host woke the run's goroutines (wall time).
	Host HostLag
	// Slowed is the probe that made the demo run at BusyTimeScale
	// (Config.TimeScale zero and a busy host); zero otherwise.
	Slowed HostLag
}

// PolicyResult is one policy's run.
type PolicyResult struct {
	// Policy names the routing policy.
	Policy string
	// Replicas are the replicas' base URLs, in the router's order.
	Replicas []string
	// Load is what the client measured.
	Load *loadgen.Result
	// Report is Load summarised for package report, its latencies the
	// engines' own (model time, from a request's arrival at its engine),
	// with the router's predicted hit rate and decision reasons filled in.
	Report report.Result
	// Untimed counts completed requests the engines reported no timing
	// for (their latencies are the client's, wall time / time scale).
	Untimed int
	// LagP50 and LagP90 are how long requests took from the client's
	// send to their engine (model time): the router's and the host's
	// part, which the engines' latencies leave out.
	LagP50, LagP90 time.Duration
	// samples are Report's samples, in Load.Samples' order.
	samples []report.Sample
	// Engines are the replicas' own figures scraped at the end, summed.
	Engines loadgen.EngineFigures
	// Wall is this policy's wall time, fleet start to stop.
	Wall time.Duration
	// Scales are the router's TTFT corrections per replica at the end:
	// 1, since the demo pins its calibration to the preset's rates at the
	// replicas' time scale, at which the replicas run.
	Scales []float64
}

func (c Config) withDefaults() Config {
	if c.Replicas <= 0 {
		c.Replicas = DefaultReplicas
	}
	if len(c.Policies) == 0 {
		c.Policies = DefaultPolicies()
	}
	if c.Workload == "" {
		c.Workload = ChatWorkload
	}
	if c.Requests <= 0 {
		c.Requests = DefaultRequests
	}
	if c.Preset == "" {
		c.Preset = engine.DefaultPreset
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Run runs the demo: for each policy, a cold fleet and router, the
// workload replayed through it, the engines scraped. It fails if a fleet
// cannot start or ctx ends; request errors are counted, not fatal.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg = cfg.withDefaults()
	reqs, err := Workload(cfg.Workload, cfg.Requests, cfg.Seed, 90*time.Second)
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	start := time.Now()
	res := &Result{Config: cfg}
	if cfg.TimeScale <= 0 {
		res.Config.TimeScale, res.Slowed = pickTimeScale(ctx)
		cfg.TimeScale = res.Config.TimeScale
	}
	probe := startProbe()
	defer func() {
		if probe != nil {
			probe.Stop()
		}
	}()
	for _, p := range cfg.Policies {
		cfg.Progress.SetLabel(p)
		pr, err := runPolicy(ctx, cfg, p, reqs)
		if err != nil {
			return nil, fmt.Errorf("demo %s: %w", p, err)
		}
		res.Policies = append(res.Policies, *pr)
	}
	res.Host, probe = probe.Stop(), nil
	if !cfg.NoSizing {
		if res.Sizing, err = size(cfg, reqs); err != nil {
			return nil, fmt.Errorf("demo: %w", err)
		}
	}
	res.Wall = time.Since(start)
	return res, nil
}

// demoHealthInterval is how often the demo's router probes its replicas,
// and how long a probe may take (startFleet).
const demoHealthInterval = 10 * time.Second

// busyProbe is how long pickTimeScale watches the host.
const busyProbe = time.Second

// pickTimeScale watches how late the host wakes a sleeping goroutine for
// busyProbe and returns DefaultTimeScale, or BusyTimeScale with what it
// measured when the host is busy: a busy host cannot feed in-process
// engines at 10× real time, and a router that sees them late decides on
// a stale view.
func pickTimeScale(ctx context.Context) (float64, HostLag) {
	p := startProbe()
	select {
	case <-time.After(busyProbe):
	case <-ctx.Done():
	}
	if lag := p.Stop(); lag.Busy() {
		return BusyTimeScale, lag
	}
	return DefaultTimeScale, HostLag{}
}

// runPolicy starts a cold fleet and router for policy, replays reqs
// through it and scrapes the engines.
func runPolicy(ctx context.Context, cfg Config, policy string, reqs []trace.Request) (*PolicyResult, error) {
	t0 := time.Now()
	pol, err := route.New(policy)
	if err != nil {
		return nil, err
	}
	times := newEngineTimes()
	fl, err := startFleet(cfg, policy, times)
	if err != nil {
		return nil, err
	}
	defer fl.close()
	load, err := loadgen.Run(ctx, loadgen.Config{
		Target: fl.url, Model: fl.model, Requests: reqs, TimeScale: cfg.TimeScale,
		Duration: 5 * time.Minute, IgnoreEOS: true, IDHeader: idHeader, Parallel: Parallel,
		OnDone: func(loadgen.Sample) { cfg.Progress.Add(1) },
	})
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	pr := &PolicyResult{Policy: policy, Replicas: fl.urls(), Load: load}
	for _, s := range fl.reps {
		f, err := loadgen.ScrapeEngine(ctx, http.DefaultClient, s.URL())
		if err != nil {
			return nil, err
		}
		pr.Engines = pr.Engines.Add(f)
	}
	pr.samples, pr.Untimed = times.samples(load, pr.Replicas)
	pr.LagP50, pr.LagP90 = times.lag(load)
	pr.Report = report.Summarize(pr.samples, report.Options{Policy: policy, Replicas: len(pr.Replicas),
		NoPrediction: route.NeedsOf(pol).Index == route.NoIndex})
	fl.decisions(&pr.Report, len(reqs))
	for _, r := range fl.rt.View(time.Now()).Replicas {
		pr.Scales = append(pr.Scales, r.Scale)
	}
	pr.Wall = time.Since(t0)
	return pr, nil
}

// cluster is one policy's replicas and router.
type cluster struct {
	reps   []*emulator.Server
	rt     *proxy.Router
	srv    *http.Server
	url    string
	model  string
	cancel context.CancelFunc
	done   chan error
}

// startFleet starts cfg.Replicas emulated replicas (HTTP and a KV-event
// publisher on loopback) and a router with policy in front of them.
func startFleet(cfg Config, policy string, times *engineTimes) (*cluster, error) {
	fl := &cluster{model: "demo"}
	for range cfg.Replicas {
		s, err := emulator.Start(emulator.Config{
			Model: fl.model, Preset: cfg.Preset, KVBlocks: cfg.KVBlocks, TimeScale: cfg.TimeScale,
			KVEventsEndpoint: "tcp://127.0.0.1:*", Logger: cfg.Logger, OnDone: times.record,
		}, "127.0.0.1:0")
		if err != nil {
			fl.close()
			return nil, err
		}
		fl.reps = append(fl.reps, s)
	}
	pc := proxy.DefaultConfig()
	pc.Policy = policy
	pc.Preset = cfg.Preset
	// The replicas run cfg.TimeScale wall seconds per engine second: the
	// cost model starts from the preset's rates at that scale, so its
	// predicted TTFTs are the replicas' wall times from the first request
	// (calibration, within 1/1024..1024, would learn a scale of 0.1 from
	// real-time rates, but only after some requests).
	pc.TimeScale = cfg.TimeScale
	pc.Listen = "127.0.0.1:0"
	pc.ClientHeaders = true // loadgen attributes each reply to its replica by X-Kvrouter-Replica
	pc.Decisions = max(cfg.Requests+64, proxy.DefaultDecisions)
	// Scrape as often, in model time, as a real router would every 250 ms.
	pc.ScrapeInterval = max(time.Duration(float64(250*time.Millisecond)*cfg.TimeScale), 10*time.Millisecond)
	pc.CacheBlocks = cfg.KVBlocks
	// The replicas live in this process and do not die: a probe answered
	// late only says the host is busy. At the default (a 1 s probe, two
	// missed eject) a busy host had the router eject replicas in turn, so
	// that round-robin sent 49 13 48 10 of 120 requests and the policies
	// were compared on fleets of different sizes. Probes every 10 s, each
	// allowed 10 s, eject only a replica that stops answering for 20 s.
	pc.HealthInterval = demoHealthInterval
	// Precise mode: the router follows the replicas' KV events (ZMQ) and
	// tokenizes like them, through their /tokenize.
	pc.Tokenizer = proxy.Remote
	for _, s := range fl.reps {
		pc.Backends = append(pc.Backends, proxy.Backend{URL: s.URL(), KV: s.KVEventsEndpoint()})
	}
	// The replicas run at the preset's rates by construction (at
	// cfg.TimeScale), which is what the simulator's calibration learns
	// (scale 1): the router's is pinned there, since the wall-clock TTFTs
	// it would learn from carry the host's delays too, which on a busy
	// machine taught it that some replicas were a hundred times slower
	// than others and sent nearly everything to the rest.
	rt, err := proxy.New(pc, proxy.Deps{Registry: prometheus.NewRegistry(), Logger: cfg.Logger,
		Calibration: fleet.Calibrator{Min: 1, Max: 1}})
	if err != nil {
		fl.close()
		return nil, err
	}
	ln, err := net.Listen("tcp", pc.Listen)
	if err != nil {
		fl.close()
		return nil, fmt.Errorf("router listen: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	fl.rt, fl.cancel, fl.done = rt, cancel, make(chan error, 2)
	fl.srv = &http.Server{Handler: rt.Handler(), ReadHeaderTimeout: 10 * time.Second}
	fl.url = "http://" + ln.Addr().String()
	go func() { fl.done <- rt.Run(ctx) }()
	go func() {
		if err := fl.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			fl.done <- err
			return
		}
		fl.done <- nil
	}()
	return fl, nil
}

// urls returns the replicas' base URLs.
func (fl *cluster) urls() []string {
	out := make([]string, len(fl.reps))
	for i, s := range fl.reps {
		out[i] = s.URL()
	}
	return out
}

// decisions fills the router's predicted hit rate and decision reasons
// from its last n decision records.
func (fl *cluster) decisions(r *report.Result, n int) {
	var predicted, prompt int64
	r.Reasons = map[string]int{}
	for _, rec := range fl.rt.Decisions(n) {
		r.Reasons[rec.Reason]++
		if rec.PromptTokens > 0 && !r.NoPrediction {
			predicted += int64(rec.PredictedCached)
			prompt += int64(rec.PromptTokens)
		}
	}
	if prompt > 0 {
		r.PredictedHitRate = float64(predicted) / float64(prompt)
	}
}

// close stops the router and the replicas and waits for them.
func (fl *cluster) close() {
	if fl.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		fl.srv.Shutdown(ctx)
		cancel()
		fl.cancel()
		<-fl.done
		<-fl.done
	}
	for _, s := range fl.reps {
		s.Close()
	}
}

// Package sim is the fleet simulator: a trace-driven discrete-event
// simulation of a fleet of engine models (package engine) on one virtual
// clock, each request routed by a policy (package route) through a fleet
// snapshot built the way the live router builds it.
//
// One goroutine, one event heap, virtual time. The events are arrivals,
// engine wake-ups (one pending per replica), scrape ticks (engine metrics in
// the snapshot are refreshed only then, so they are stale by up to the
// scrape interval), delayed KV events (precise mode), fleet events (a
// replica killed or added) and load-sample ticks. Every policy runs on a
// fresh fleet over the same requests; the same seed gives the same output,
// byte for byte.
package sim

import (
	"fmt"
	"time"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/residency"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/trace"
)

// Defaults of Config's zero fields.
const (
	// DefaultScrapeInterval is how often engine metrics reach the snapshot.
	DefaultScrapeInterval = 100 * time.Millisecond
	// PreciseSuffix, appended to a policy name, runs that policy with a
	// precise index (engine KV events) instead of its own: "kv-aware-precise".
	PreciseSuffix = "-precise"
)

// Index modes of Config.Mode.
const (
	// ModeApproximate: kv-aware reads an index fed by its routing decisions.
	ModeApproximate = "approximate"
	// ModePrecise: kv-aware reads an index fed by the engines' KV events.
	ModePrecise = "precise"
)

// SLO is the goodput target: a request meets it when its TTFT and its mean
// ITL are both within bounds. Zero fields are derived from the preset and
// the workload's median prompt P (see derive): five times what P takes
// alone on an idle replica.
type SLO struct {
	// TTFT is the time-to-first-token bound; zero means 5× the uncached
	// prefill of P on an idle replica.
	TTFT time.Duration
	// ITL is the mean inter-token latency bound; zero means 5× one decode
	// iteration of a batch of one at context P.
	ITL time.Duration
}

// Config is one simulation: a workload, a fleet and the policies to compare.
type Config struct {
	// Workload names the workload in the report ("mooncake-conversation").
	Workload string
	// Requests are the requests, in arrival order (At ascending).
	Requests []trace.Request
	// Fleet are fleet events (kill or add a replica), in time order, on the
	// requests' original clock (scaled like the arrivals).
	Fleet []trace.FleetEvent
	// Replicas is the fleet size at the start; zero means 16.
	Replicas int
	// Models is the number of models the fleet serves; zero means 1.
	// Replica i serves model i mod Models, and each request asks for one,
	// by its session (else tenant, else id), so that the router's model
	// routing is exercised: no request may reach a replica without its
	// model.
	Models int
	// PresetName names Preset in the report ("llama3-8b-h100").
	PresetName string
	// Preset is every replica's engine configuration (engine.Preset).
	// NoTokenEvents is forced off: the tickets learn from the tokens as
	// they stream, as the live router's do (fleet.Ticket.Token). Its CPUBlocks gives every replica a CPU
	// offload tier.
	Preset engine.Config
	// InterconnectGBps, when positive, lets replicas import KV from one
	// another over links of that many GB/s each way (the engines'
	// InterconnectGBps), and the policies that can order transfers
	// (route.Decision.Transfer) do; zero means no transfers.
	InterconnectGBps float64
	// PrefillReplicas, when positive, makes the fleet disaggregated: the
	// first PrefillReplicas of the Replicas are prefill workers
	// (route.RolePrefill), the rest decode (route.RoleDecode), and KV
	// transfers are on (at InterconnectGBps, else the preset's). A
	// policy's decision with a prefill leg runs it as the live router
	// does (legs.go). Zero means an aggregated fleet.
	PrefillReplicas int
	// Load is the arrival rate as a multiple of the fleet's knee: at 1,
	// requests arrive at the rate at which a balanced fleet that caches
	// nothing just meets the SLO (kneeRate). Arrival times are scaled to
	// meet it. Zero defers to RateScale.
	Load float64
	// RateScale, when Load is zero, multiplies the requests' own arrival
	// rate (2 is twice the traffic of the trace); zero keeps their times.
	RateScale float64
	// Policies are route policy names (route.Names()), plus any name with
	// the PreciseSuffix. Empty means every route policy.
	Policies []string
	// Seed varies the policies' tie-breaks (it is mixed into each request's
	// hash); workload generators take it separately.
	Seed uint64
	// ScrapeInterval is how often engine metrics (Running, Waiting,
	// KVUsage) reach the snapshot, unless the policy's Needs says its own;
	// zero means 100 ms.
	ScrapeInterval time.Duration
	// KVEventDelay is how long an engine KV event takes to reach a precise
	// index; zero means immediately.
	KVEventDelay time.Duration
	// Mode is ModeApproximate (the default) or ModePrecise: the index
	// "kv-aware" reads.
	Mode string
	// SLO is the goodput target; zero fields are derived (see SLO).
	SLO SLO
	// EndStreams ends a request whose replica dies after its first token
	// with an error, as the live router does with --stream-continue=false;
	// false, the router's default, continues it on another replica
	// (continue.go). Before the first token the router retries it either
	// way.
	EndStreams bool
	// Admission is the router's admission control, as the live router's
	// (fleet.Admission): a request no replica can take within MaxWait
	// waits in the router's queue, and one that finds it full, or waits
	// past its timeout, is rejected (reported as such: a policy that sheds
	// load shows its rejections). The zero value is off.
	Admission fleet.Admission
	// Progress, if set, is called now and then with the requests finished
	// by the policy running and the requests of the run.
	Progress func(policy string, done, total int)

	// Cancel, when closed, stops the run with an error (a signal in the
	// command); nil means never.
	Cancel <-chan struct{}

	// Trace, if set, receives every step of the router's side of each
	// policy's run, in order (see Step): a transcript the live router can
	// be driven with, step for step (proxy's parity test does).
	Trace func(policy string, s Step)

	// Routers is the number of routers (each a fleet of its own over the
	// same engines, exchanging their shares every SyncInterval: see
	// routers.go); zero means 1. Trace then interleaves every router's
	// steps: a transcript for one live router needs Routers 1.
	Routers int
	// SyncInterval is the virtual time between the routers' exchanges;
	// zero means DefaultSyncInterval, negative never (each router decides
	// on its own view: the control of a comparison).
	SyncInterval time.Duration
	// Assign is how requests are given to routers: AssignRoundRobin (the
	// default) or AssignHash.
	Assign string

	// fleet is Fleet on the scaled clock (set by Run).
	fleet []fleetEvent
	// adds is the number of Add events of Fleet.
	adds int
}

// withDefaults fills zero fields and validates.
func (c Config) withDefaults() (Config, error) {
	if c.Replicas == 0 {
		c.Replicas = 16
	}
	if c.Replicas < 1 {
		return c, fmt.Errorf("sim: %d replicas < 1", c.Replicas)
	}
	c.adds = 0
	for _, fe := range c.Fleet {
		if fe.Kind == trace.Add {
			c.adds++
		}
	}
	if c.Replicas+c.adds > residency.MaxReplicasLimit {
		return c, fmt.Errorf("sim: %d replicas > %d", c.Replicas+c.adds, residency.MaxReplicasLimit)
	}
	if c.Models == 0 {
		c.Models = 1
	}
	if c.Models < 1 || c.Models > c.Replicas {
		return c, fmt.Errorf("sim: %d models for %d replicas: want 1 to %d", c.Models, c.Replicas, c.Replicas)
	}
	if c.Load < 0 || c.RateScale < 0 {
		return c, fmt.Errorf("sim: load %g or rate scale %g < 0", c.Load, c.RateScale)
	}
	if c.ScrapeInterval == 0 {
		c.ScrapeInterval = DefaultScrapeInterval
	}
	if c.ScrapeInterval < 0 || c.KVEventDelay < 0 {
		return c, fmt.Errorf("sim: negative scrape interval or KV event delay")
	}
	switch c.Mode {
	case "":
		c.Mode = ModeApproximate
	case ModeApproximate, ModePrecise:
	default:
		return c, fmt.Errorf("sim: mode %q: want %s or %s", c.Mode, ModeApproximate, ModePrecise)
	}
	if c.SLO.TTFT < 0 || c.SLO.ITL < 0 {
		return c, fmt.Errorf("sim: negative SLO")
	}
	if len(c.Policies) == 0 {
		c.Policies = route.Names()
	}
	if err := c.checkRouters(); err != nil {
		return c, err
	}
	c.Preset.NoTokenEvents = false
	if c.InterconnectGBps < 0 {
		return c, fmt.Errorf("sim: interconnect bandwidth %g GB/s < 0", c.InterconnectGBps)
	}
	if c.InterconnectGBps > 0 {
		c.Preset.InterconnectGBps = c.InterconnectGBps
	}
	if c.PrefillReplicas < 0 || c.PrefillReplicas >= c.Replicas {
		return c, fmt.Errorf("sim: %d prefill replicas of %d: want 0 to %d, some must decode", c.PrefillReplicas, c.Replicas, c.Replicas-1)
	}
	e, err := engine.New(c.Preset)
	if err != nil {
		return c, fmt.Errorf("sim: preset: %w", err)
	}
	c.Preset = e.Config() // zero fields filled
	for _, p := range c.Policies {
		if _, _, err := policyOf(p); err != nil {
			return c, fmt.Errorf("sim: %w", err)
		}
	}
	return c, nil
}

// outcome is everything a simulation produced, before reporting.
type outcome struct {
	cfg    Config
	jobs   []job
	factor float64 // arrival time scale applied (0: spaced evenly)
	// rate is the arrival rate of the run and knee that of Load 1, in
	// requests per second; own is the requests' own (0: all at once).
	rate, knee, own float64
	infinite        oracleResult
	pooled          oracleResult
	runs            []*result
	names           []string
}

// simulate runs every policy of cfg over the same jobs.
func simulate(cfg Config) (*outcome, error) {
	o, err := prepare(cfg)
	if err != nil {
		return nil, err
	}
	for _, name := range o.cfg.Policies {
		res, err := o.run(name)
		if err != nil {
			return nil, err
		}
		o.runs = append(o.runs, res)
	}
	return o, nil
}

// run simulates one policy over o's jobs on a fresh fleet.
func (o *outcome) run(name string) (*result, error) {
	r, err := newRunner(&o.cfg, o.jobs, name)
	if err != nil {
		return nil, err
	}
	r.run()
	if r.err != nil {
		return nil, fmt.Errorf("sim %s: %w", name, r.err)
	}
	return &r.res, nil
}

// prepare validates cfg, derives the jobs and computes the oracles.
func prepare(cfg Config) (*outcome, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	bs := cfg.Preset.BlockSize
	jobs := makeJobs(cfg.Requests, bs, cfg.Seed, cfg.Models)
	cfg.SLO = cfg.SLO.derive(jobs, &cfg.Preset)
	classSLOs(jobs, &cfg.Preset)
	own, knee := ownRate(jobs), fullRate(jobs, &cfg.Preset, cfg.Replicas, cfg.SLO)
	rate := cfg.Load * knee
	if cfg.Load == 0 {
		rate = cfg.RateScale * own
		if cfg.RateScale > 0 && own == 0 {
			return nil, fmt.Errorf("sim: --rate-scale on requests that all arrive at once: give a load")
		}
	}
	factor := scaleArrivals(jobs, rate)
	if rate <= 0 {
		rate = own
	}
	var t0 time.Duration
	if len(cfg.Requests) > 0 {
		t0 = cfg.Requests[0].At
	}
	cfg.fleet = make([]fleetEvent, len(cfg.Fleet))
	for i, fe := range cfg.Fleet {
		at := fe.At - t0
		if factor > 0 {
			at = time.Duration(float64(at) * factor)
		} else if len(jobs) > 0 && len(cfg.Requests) > 0 {
			// Arrivals were spaced evenly: place the event at the same
			// fraction of the requests.
			at = jobs[min(sortIndex(cfg.Requests, fe.At), len(jobs)-1)].at
		}
		cfg.fleet[i] = fleetEvent{at: max(at, 0), kind: fe.Kind, replica: fe.Replica}
	}
	o := &outcome{cfg: cfg, jobs: jobs, factor: factor, names: cfg.Policies, rate: rate, knee: knee, own: own}
	o.infinite = infiniteOracle(jobs, &cfg.Preset)
	o.pooled = pooledOracle(jobs, &cfg.Preset, cfg.Replicas*cfg.Preset.NumBlocks, cfg.Replicas*cfg.Preset.CPUBlocks)
	return o, nil
}

// sortIndex is the number of requests arriving before t.
func sortIndex(reqs []trace.Request, t time.Duration) int {
	n := 0
	for n < len(reqs) && reqs[n].At < t {
		n++
	}
	return n
}

// allPolicies is every route policy plus kv-aware in precise mode.
func allPolicies() []string {
	return append(route.Names(), "kv-aware"+PreciseSuffix)
}

// Run simulates every policy of cfg on a fresh fleet over the same
// requests and returns the comparison: the run's parameters, the two
// oracle rows (infinite and pooled cache) and one report.Result per
// policy, in the order of cfg.Policies.
func Run(cfg Config) (report.Run, error) {
	o, err := prepare(cfg)
	if err != nil {
		return report.Run{}, err
	}
	slo := report.SLO(o.cfg.SLO)
	run := report.Run{Title: "kvrouter simulation: " + o.cfg.Workload, Params: o.params(), SLO: &slo, Oracles: []report.Oracle{
		{Name: report.OracleInfinite, HitRate: o.infinite.rate()},
		{Name: report.OraclePooled, HitRate: o.pooled.rate()},
	}}
	for _, name := range o.cfg.Policies {
		res, err := o.run(name)
		if err != nil {
			return report.Run{}, err
		}
		pr := report.Summarize(res.samples, report.Options{Policy: name, SLO: slo, Replicas: res.replicas, NoPrediction: res.noIndex})
		pr.Transfers, pr.TransferBytes = res.transfers, res.transferBytes
		pr.Learned = res.learned
		run.Policies = append(run.Policies, pr)
	}
	return run, nil
}

// params lists the run's parameters for the report header and JSON.
func (o *outcome) params() []report.Param {
	c := &o.cfg
	var span time.Duration
	if n := len(o.jobs); n > 0 {
		span = o.jobs[n-1].at
	}
	p := func(name string, v any) report.Param { return report.Param{Name: name, Value: fmt.Sprint(v)} }
	ps := []report.Param{
		p("workload", c.Workload),
		p("requests", len(o.jobs)),
		p("replicas", c.Replicas),
		p("models", c.Models),
		p("preset", c.PresetName),
		p("preset_blocks", c.Preset.NumBlocks),
		p("block_size", c.Preset.BlockSize),
		p("load", c.Load),
		p("rate_scale", c.RateScale),
		p("arrival_rate", fmt.Sprintf("%.3g/s", o.rate)),
		p("knee_rate", fmt.Sprintf("%.3g/s", o.knee)),
		p("arrival_span", span.Round(time.Millisecond)),
		p("seed", c.Seed),
		p("scrape_interval", c.ScrapeInterval),
		p("kv_event_delay", c.KVEventDelay),
		p("mode", c.Mode),
		p("slo_ttft", c.SLO.TTFT),
		p("slo_itl", c.SLO.ITL),
		p("fleet_events", len(c.Fleet)),
	}
	if c.Routers > 1 {
		ps = append(ps, p("routers", c.Routers), p("sync_interval", c.SyncInterval), p("assign", c.Assign))
	}
	if c.PrefillReplicas > 0 {
		ps = append(ps, p("prefill_replicas", c.PrefillReplicas))
	}
	if c.InterconnectGBps > 0 {
		ps = append(ps, p("interconnect_gbps", c.InterconnectGBps))
	}
	return ps
}

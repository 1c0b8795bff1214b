package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/demo"
	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/sim"
	"github.com/kvrouter/kvrouter/trace"
)

// runSim is "kvrouter sim": simulate a fleet on one workload or a
// leaderboard of (workload, load) cells under several routing policies,
// side by side, and print the comparison.
func runSim(ctx context.Context, args []string) error {
	return simCommand(ctx, args, os.Stdout, os.Stderr)
}

var simHelp = help{
	synopsis: "kvrouter sim [flags]",
	about: "Simulates a fleet of modelled engines (--preset) on a virtual clock under several\n" +
		"routing policies, side by side: each policy routes the same requests on a fresh\n" +
		"fleet with the live router's own code. No GPU, no network; seconds per policy.\n" +
		"It prints per policy TTFT, end-to-end and inter-token latency, the prefix hit\n" +
		"rate against the oracle ceilings, goodput under an SLO (derived from the preset\n" +
		"and the workload unless given) and rejections. --workload and --load take lists:\n" +
		"every (workload, load) cell runs, each with the policies' ranks on TTFT p99, TTFT\n" +
		"mean, E2E p99 and hit rate, then a summary of which policy wins where and by how\n" +
		"much, and whether the default policy (" + route.Default + ") is within 3% of the best.\n" +
		"--json prints it for machines, --report as an HTML page. --capacity finds each\n" +
		"policy's capacity at the SLO instead: the highest load at which 99% (and 90%) of\n" +
		"requests meet it, with the attainment at every load searched (--report draws it);\n" +
		"given with a leaderboard (--load, several cells), it adds capacity per workload\n" +
		"as a ranked column and to the summary. Built-in workloads are generated;\n" +
		"mooncake-conversation, azure-conv and azure-code read public traces (--trace\n" +
		"FILE, or ../shared/traces/).",
	examples: []string{
		"kvrouter sim --workload demo-chat --replicas 4 --policies round-robin,session-hash,kv-aware",
		"kvrouter sim --workload shared-prefix --replicas 8 --load 0.9 --report sim.html",
		"kvrouter sim --workload shared-prefix,agentic --load 0.5,0.95 --policies all --json > board.json",
		"kvrouter sim --capacity --workload shared-prefix --requests 600 --policies kv-aware,least-loaded,round-robin --report capacity.html",
		"kvrouter sim --capacity --workload shared-prefix,agentic --load 0.5,0.95 --policies kv-aware,least-loaded,round-robin --report board.html",
		"kvrouter sim --trace conversation_trace.jsonl --replicas 16 --policies all   # the Mooncake trace",
	},
}

// simCommand is kvrouter sim writing its results to stdout, and flag
// errors, notes and the progress bar (when it is a terminal) to stderr.
func simCommand(ctx context.Context, args []string, stdout io.Writer, stderr *os.File) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	workload := fs.String("workload", "shared-prefix", "workload, comma-separated workloads, or all (every one but demo-chat; a trace workload whose file is missing is then skipped): "+strings.Join(knownWorkloads(), ", "))
	traceFile := fs.String("trace", "", "read the requests from this trace file instead of --workload (Mooncake JSONL, a kvrouter recording, Azure CSV); a comma-separated list or a quoted glob reads several as one trace in time order")
	traceFormat := fs.String("trace-format", "", "format of --trace: mooncake (JSONL) or azure (CSV); empty: by extension")
	replicas := fs.Int("replicas", 16, "replicas in the fleet")
	models := fs.Int("models", 1, "models the fleet serves: replica i serves model i mod N, each request asks for one (by session, tenant or id)")
	preset := fs.String("preset", engine.DefaultPreset, "engine preset: "+strings.Join(engine.Presets(), ", "))
	presetFileFlag(fs, preset)
	load := fs.String("load", fmt.Sprint(simDefaultLoad), "arrival rate as a multiple of the fleet's knee (1: a balanced fleet caching nothing just meets the SLO), or comma-separated multiples (0: see --rate-scale)")
	rateScale := fs.Float64("rate-scale", 0, "with --load 0: multiply the workload's own arrival rate by this (0 keeps its times)")
	capacity := fs.Bool("capacity", false, "find each policy's capacity at the SLO instead: the highest load at which 99% (and 90%) of requests meet it, by bisection (--load is ignored); with a leaderboard (--load given, and several workloads or loads) run it too and add capacity, searched once per workload, as a ranked column")
	tolerance := fs.Float64("tolerance", sim.DefaultTolerance, "with --capacity: relative step of the grid of loads searched")
	policies := fs.String("policies", "all", "comma-separated policies, or all (every policy plus kv-aware-precise): "+strings.Join(route.Names(), ", "))
	seed := fs.Uint64("seed", 1, "seed of the workload generator and the policies' tie-breaks")
	requests := fs.Int("requests", 0, "number of requests per workload (0: the workload's default or the whole trace)")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	htmlOut := fs.String("report", "", "write a self-contained HTML report to this file")
	scrape := fs.Duration("scrape-interval", sim.DefaultScrapeInterval, "how often engine metrics reach the router")
	kvDelay := fs.Duration("kv-event-delay", 10*time.Millisecond, "delay of KV events to a precise index")
	mode := fs.String("mode", sim.ModeApproximate, "index of kv-aware: approximate or precise")
	sloTTFT := fs.Duration("slo-ttft", 0, "goodput SLO: time to first token (0: 5× the uncached prefill of the workload's median prompt on an idle replica)")
	sloITL := fs.Duration("slo-itl", 0, "goodput SLO: mean inter-token latency (0: 5× one decode step of a batch of one at the median prompt)")
	sloList := fs.String("slo", "", "goodput SLOs as TTFT/ITL pairs, comma-separated (1s/50ms,2s/100ms), or derived (as --slo-ttft and --slo-itl 0 give it); several need --capacity, which then searches under each; empty: --slo-ttft and --slo-itl")
	sloClass := fs.String("slo-class", "", "with --capacity: count only the requests of this SLO class (interactive-batch's interactive or batch, a trace's slo_class) toward the levels, each held to its class's SLO")
	seeds := fs.Int("seeds", 1, "with --capacity: search with each of this many seeds from --seed on (each generating the workload and breaking ties anew) and report every policy's median capacity and its range, and "+route.Default+"'s ratio to the best other's")
	interconnect := fs.Float64("interconnect-gbps", 0, "let replicas import KV from each other over links of this many GB/s each way (policies that can order transfers do: kv-aware, mooncake-global); 0: no transfers")
	prefillReplicas := fs.String("prefill-replicas", "0", "make the fleet disaggregated: this many of --replicas are prefill workers, the rest decode, and KV transfers are on (at --interconnect-gbps, else the preset's); 0: aggregated. Several, comma-separated (0,4,8), run every split of the same fleet at the same arrival rate side by side, each row named for its split; with --capacity, each split's capacity is searched")
	cpuBlocks := fs.Int("cpu-kv-blocks", 0, "give every replica a CPU offload tier of this many KV blocks (see kvrouter engine -h); 0: none")
	pcie := fs.Float64("pcie-gbps", 0, fmt.Sprintf("host-to-GPU bandwidth of the CPU tier in GB/s; 0: %d", engine.DefaultPCIeGBps))
	routers := fs.Int("routers", 1, "routers in front of the fleet, each with its own fleet state, exchanging their shares every --sync-interval (as --redis does live)")
	syncInterval := fs.Duration("sync-interval", sim.DefaultSyncInterval, "virtual time between the routers' exchanges (with --routers > 1; negative: never, each router decides alone)")
	assign := fs.String("assign", sim.AssignRoundRobin, "how requests are given to routers: round-robin or hash (of the session, else the request id)")
	streamContinue := fs.Bool("stream-continue", true, "continue a request whose replica dies after its first token on another replica, as the live router does (false: it ends with an error); before its first token it is retried either way")
	adm := fleet.Admission{MaxWait: fleet.DefaultMaxWait, MaxQueue: fleet.DefaultMaxQueue, QueueTimeout: fleet.DefaultQueueTimeout}
	admissionFlags(fs, &adm.MaxWait, &adm.MaxQueue, &adm.QueueTimeout)
	fs.StringVar(&adm.SLO, "slo-admission", fleet.SLORoute, "what the router does with a request no replica is predicted to meet the SLO of (predicted miss >= "+strconv.FormatFloat(fleet.MissThreshold, 'g', -1, 64)+"), as kvrouter serve's flag: route (anyway), queue (in the router's queue, decided again until a replica is predicted to meet it; rejected once its TTFT bound passes) or reject (counted as rejected: a miss in attainment)")
	if err := parseFlags(fs, args, simHelp, stderr); err != nil {
		return err
	}
	if err := adm.Validate(); err != nil {
		return err
	}
	loads, err := parseLoads(*load)
	if err != nil {
		return err
	}
	slos := []sim.SLO{{TTFT: *sloTTFT, ITL: *sloITL}}
	if *sloList != "" {
		if isSet(fs, "slo-ttft") || isSet(fs, "slo-itl") {
			return errors.New("--slo replaces --slo-ttft and --slo-itl: give one or the other")
		}
		if slos, err = parseSLOs(*sloList); err != nil {
			return err
		}
	}
	if *seeds < 1 {
		return fmt.Errorf("--seeds %d: want at least 1", *seeds)
	}
	splits, err := parseSplits(*prefillReplicas, *replicas)
	if err != nil {
		return err
	}
	cfg, err := engine.Preset(*preset)
	if err != nil {
		return err
	}
	cfg.CPUBlocks, cfg.PCIeGBps = *cpuBlocks, *pcie
	ws, err := simWorkloads(*workload, *traceFile, *traceFormat, *seed, *requests, sim.FleetKVTokens(cfg, *replicas), stderr)
	if err != nil {
		return err
	}
	base := sim.Config{
		Replicas: *replicas, Models: *models, PresetName: *preset, Preset: cfg, Policies: policyNames(*policies, splits[0] > 0),
		Seed: *seed, ScrapeInterval: *scrape, KVEventDelay: *kvDelay, Mode: *mode,
		SLO: slos[0], Admission: adm, Cancel: ctx.Done(), InterconnectGBps: *interconnect, PrefillReplicas: splits[0],
		Routers: *routers, SyncInterval: *syncInterval, Assign: *assign, EndStreams: !*streamContinue,
	}
	base.RateScale = *rateScale
	search := sim.CapacitySearch{Tolerance: *tolerance, Class: *sloClass}
	board := isSet(fs, "load") && len(ws)*len(loads) > 1
	if *capacity && !board {
		y := yardstick{seeds: seedList(*seed, *seeds), slos: slos, workloads: func(s uint64) ([]*trace.Workload, error) {
			if s == *seed {
				return ws, nil
			}
			return simWorkloads(*workload, *traceFile, *traceFormat, s, *requests, sim.FleetKVTokens(cfg, *replicas), stderr)
		}}
		return runCapacity(base, y, splits, *policies, search, stdout, stderr, *htmlOut, *asJSON)
	}
	if *seeds > 1 || len(slos) > 1 {
		return errors.New("--seeds and several --slo pairs take --capacity without a leaderboard (several workloads or loads with --load)")
	}
	if *capacity && len(splits) > 1 {
		return errors.New("--capacity with a leaderboard takes one --prefill-replicas count; alone, it searches every split")
	}
	cs := cells(base, ws, loads)
	if len(splits) > 1 {
		cs = splitCells(cs, splits, *policies)
	}
	runs, err := runCells(cs, stderr)
	if err != nil {
		return err
	}
	if len(splits) > 1 {
		runs = mergeSplits(runs, splits, *replicas)
	}
	out := runWriters(&runs[0])
	if len(runs) > 1 {
		b := report.NewBoard(runs, route.Default)
		if *capacity {
			caps, err := capacities(base, ws, splits, *policies, search, stderr)
			if err != nil {
				return err
			}
			b.AddCapacity(caps)
		}
		out = boardWriters(b)
	}
	return out.write(stdout, *htmlOut, *asJSON)
}

// isSet reports whether the flag name was given on fs's command line.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// admissionFlags binds the admission-control flags, which serve and sim
// share (fleet.Admission), with the values they point to as defaults.
func admissionFlags(fs *flag.FlagSet, maxWait *time.Duration, maxQueue *int, timeout *time.Duration) {
	fs.DurationVar(maxWait, "max-wait", *maxWait, "admission control: a request that no replica can start within this predicted wait is held in the router's queue until one can (0: off)")
	fs.IntVar(maxQueue, "max-queue", *maxQueue, "admission control: requests the router's queue holds; past it the lowest priority is rejected with 429")
	fs.DurationVar(timeout, "queue-timeout", *timeout, "admission control: longest wait in the router's queue before a 429")
}

// policyNames parses --policies.
func policyNames(s string, disaggregated bool) []string {
	if s == "all" && disaggregated {
		return append(append(route.Names(), route.PDNames()...), "kv-aware"+sim.PreciseSuffix)
	}
	if s == "all" {
		return append(route.Names(), "kv-aware"+sim.PreciseSuffix)
	}
	names := []string{}
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			names = append(names, p)
		}
	}
	return names
}

// writers are the three ways kvrouter sim writes its result.
type writers struct{ html, json, table func(io.Writer) error }

// write writes the HTML report to htmlOut if set, then JSON or the table
// to stdout.
func (ws writers) write(stdout io.Writer, htmlOut string, asJSON bool) error {
	if htmlOut != "" {
		if err := writeFile(htmlOut, ws.html); err != nil {
			return err
		}
	}
	if asJSON {
		return ws.json(stdout)
	}
	return ws.table(stdout)
}

// runWriters write one cell's run.
func runWriters(r *report.Run) writers {
	return writers{
		html:  func(w io.Writer) error { return report.WriteHTML(w, r) },
		json:  func(w io.Writer) error { return report.WriteJSON(w, r) },
		table: func(w io.Writer) error { return report.WriteTable(w, r) },
	}
}

// knownWorkloads lists the workloads --workload takes: trace.Names() and
// the demo's own, demo.ChatWorkload (generated by package demo, whose
// generator this reuses).
func knownWorkloads() []string { return append(trace.Names(), demo.ChatWorkload) }

// loadWorkload reads --trace or generates --workload, sized (where the
// workload scales with the fleet) to kvTokens of fleet KV capacity; zero
// means the workload's fixed default size.
func loadWorkload(name, file, format string, seed uint64, requests, kvTokens int) (*trace.Workload, error) {
	if file != "" {
		return readTrace(file, format, requests)
	}
	opt := trace.GenOptions{Seed: seed, Requests: requests, FleetKVTokens: kvTokens}
	switch name {
	case demo.ChatWorkload:
		if requests <= 0 {
			requests = demo.DefaultRequests
		}
		reqs, err := demo.Workload(name, requests, seed, 0)
		if err != nil {
			return nil, err
		}
		return &trace.Workload{Name: name, Requests: reqs}, nil
	case "mooncake-conversation", "azure-conv", "azure-code":
		dir, err := traceDir()
		if err == nil {
			opt.TraceDir = dir
			var w *trace.Workload
			if w, err = trace.Generate(name, opt); err == nil {
				return w, nil
			}
		}
		if errors.Is(err, os.ErrNotExist) {
			return nil, missingTrace(name)
		}
		return nil, fmt.Errorf("workload %s: %w", name, err)
	}
	return trace.Generate(name, opt)
}

// publicTraces says where each trace workload's file comes from: traces
// stay out of the repository.
var publicTraces = map[string]struct{ file, source, url string }{
	"mooncake-conversation": {"conversation_trace.jsonl", "the Mooncake repository (kvcache-ai/Mooncake), FAST25-release/traces/",
		"https://raw.githubusercontent.com/kvcache-ai/Mooncake/main/FAST25-release/traces/conversation_trace.jsonl"},
	"azure-conv": {"AzureLLMInferenceTrace_conv.csv", "the Azure Public Dataset (Azure/AzurePublicDataset), data/",
		"https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/AzureLLMInferenceTrace_conv.csv"},
	"azure-code": {"AzureLLMInferenceTrace_code.csv", "the Azure Public Dataset (Azure/AzurePublicDataset), data/",
		"https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/AzureLLMInferenceTrace_code.csv"},
}

// missingTrace is the error for a trace workload whose file is not
// found: where the public trace lives and how to pass it. It is an
// os.ErrNotExist (--workload all skips such a workload).
type missingTrace string

func (name missingTrace) Error() string {
	t := publicTraces[string(name)]
	sub := "azure"
	if name == "mooncake-conversation" {
		sub = "mooncake"
	}
	return fmt.Sprintf("workload %s: trace file %s not found; the trace is public and stays out of this repository.\n"+
		"  Get it from %s:\n"+
		"    curl -LO %s\n"+
		"  then pass it with --trace %s (or put it in %s, beside the checkout).",
		string(name), t.file, t.source, t.url, t.file, filepath.Join("..", "shared", "traces", sub))
}

// Is makes a missingTrace an os.ErrNotExist.
func (missingTrace) Is(target error) bool { return target == os.ErrNotExist }

// traceDir finds the shared traces: ../shared/traces from the working
// directory, else beside the module root.
func traceDir() (string, error) {
	tried := []string{filepath.Join("..", "shared", "traces"), trace.DefaultDir()}
	for _, d := range tried {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			return d, nil
		}
	}
	return "", fmt.Errorf("trace directory not found (tried %s; pass --trace FILE): %w", strings.Join(tried, ", "), os.ErrNotExist)
}

// readTrace reads a trace file in the given format (by extension when
// empty: then path may also be a comma-separated list or a glob of
// files, read as one trace; trace.Expand), keeping the first requests
// when requests > 0.
func readTrace(path, format string, requests int) (*trace.Workload, error) {
	var w *trace.Workload
	switch format {
	case "":
		paths, err := trace.Expand(path)
		if err != nil {
			return nil, err
		}
		if w, err = trace.ReadFiles(paths...); err != nil {
			return nil, err
		}
	case "mooncake", "azure":
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("trace: %w", err)
		}
		defer f.Close()
		read := trace.ReadMooncake
		if format == "azure" {
			read = trace.ReadAzure
		}
		reqs, err := trace.Collect(read(f))
		if err != nil {
			return nil, fmt.Errorf("trace %s: %w", path, err)
		}
		w = &trace.Workload{Name: filepath.Base(path), Requests: reqs}
	default:
		return nil, fmt.Errorf("trace format %q: want mooncake or azure", format)
	}
	if requests > 0 && requests < len(w.Requests) {
		w.Requests = w.Requests[:requests]
	}
	if len(w.Requests) == 0 {
		return nil, errors.New("trace " + path + ": no requests")
	}
	return w, nil
}

// writeFile creates path and writes it with fn.
func writeFile(path string, fn func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := fn(f); err != nil {
		f.Close()
		return fmt.Errorf("report %s: %w", path, err)
	}
	return f.Close()
}

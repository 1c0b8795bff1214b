package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"kvrouter/engine"
	"kvrouter/report"
	"kvrouter/route"
	"kvrouter/sim"
	"kvrouter/trace"
)

// runSim is "kvrouter sim": simulate a fleet on a workload under several
// routing policies, side by side, and print the comparison.
func runSim(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	workload := fs.String("workload", "shared-prefix", "workload: "+strings.Join(trace.Names(), ", "))
	traceFile := fs.String("trace", "", "read the requests from this trace file instead of --workload")
	traceFormat := fs.String("trace-format", "", "format of --trace: mooncake (JSONL) or azure (CSV); empty: by extension")
	replicas := fs.Int("replicas", 16, "replicas in the fleet")
	models := fs.Int("models", 1, "models the fleet serves: replica i serves model i mod N, each request asks for one (by session, tenant or id)")
	preset := fs.String("preset", "llama3-8b-h100", "engine preset: "+strings.Join(engine.Presets(), ", "))
	load := fs.Float64("load", 0.8, "offered work as a fraction of fleet capacity (0 keeps the trace's times)")
	policies := fs.String("policies", "all", "comma-separated policies, or all (every policy plus kv-aware-precise): "+strings.Join(route.Names(), ", "))
	seed := fs.Uint64("seed", 1, "seed of the workload generator and the policies' tie-breaks")
	requests := fs.Int("requests", 0, "number of requests (0: the workload's default or the whole trace)")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	htmlOut := fs.String("report", "", "write a self-contained HTML report to this file")
	scrape := fs.Duration("scrape-interval", sim.DefaultScrapeInterval, "how often engine metrics reach the router")
	kvDelay := fs.Duration("kv-event-delay", 10*time.Millisecond, "delay of KV events to a precise index")
	mode := fs.String("mode", sim.ModeApproximate, "index of kv-aware: approximate or precise")
	sloTTFT := fs.Duration("slo-ttft", 0, "goodput SLO: time to first token (0: 5× the uncached prefill of the workload's median prompt on an idle replica)")
	sloITL := fs.Duration("slo-itl", 0, "goodput SLO: mean inter-token latency (0: 5× one decode step of a batch of one at the median prompt)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg, err := engine.Preset(*preset)
	if err != nil {
		return err
	}
	w, err := loadWorkload(*workload, *traceFile, *traceFormat, *seed, *requests, sim.FleetKVTokens(cfg, *replicas))
	if err != nil {
		return err
	}
	names := []string{}
	if *policies == "all" {
		names = append(route.Names(), "kv-aware"+sim.PreciseSuffix)
	} else {
		for _, p := range strings.Split(*policies, ",") {
			if p = strings.TrimSpace(p); p != "" {
				names = append(names, p)
			}
		}
	}
	sc := sim.Config{
		Workload: w.Name, Requests: w.Requests, Fleet: w.Events, Replicas: *replicas, Models: *models,
		PresetName: *preset, Preset: cfg, Load: *load, Policies: names, Seed: *seed,
		ScrapeInterval: *scrape, KVEventDelay: *kvDelay, Mode: *mode,
		SLO: sim.SLO{TTFT: *sloTTFT, ITL: *sloITL},
	}
	bar := report.NewProgress(os.Stderr, "simulating", int64(len(w.Requests)*len(names)))
	if bar != nil {
		last := 0
		sc.Progress = func(policy string, done, total int) {
			if done < last {
				last = 0 // the next policy started
			}
			bar.SetLabel(policy)
			bar.Add(int64(done - last))
			last = done
		}
	}
	sc.Cancel = ctx.Done()
	run, err := sim.Run(sc)
	bar.Done()
	if err != nil {
		return err
	}
	if *htmlOut != "" {
		if err := writeFile(*htmlOut, func(f io.Writer) error { return report.WriteHTML(f, &run) }); err != nil {
			return err
		}
	}
	if *asJSON {
		return report.WriteJSON(os.Stdout, &run)
	}
	return report.WriteTable(os.Stdout, &run)
}

// loadWorkload reads --trace or generates --workload, sized (where the
// workload scales with the fleet) to kvTokens of fleet KV capacity; zero
// means the workload's fixed default size.
func loadWorkload(name, file, format string, seed uint64, requests, kvTokens int) (*trace.Workload, error) {
	if file != "" {
		return readTrace(file, format, requests)
	}
	opt := trace.GenOptions{Seed: seed, Requests: requests, FleetKVTokens: kvTokens}
	switch name {
	case "mooncake-conversation", "azure-conv", "azure-code":
		dir, err := traceDir()
		if err != nil {
			return nil, fmt.Errorf("workload %s: %w", name, err)
		}
		opt.TraceDir = dir
	}
	return trace.Generate(name, opt)
}

// traceDir finds the shared traces: ../shared/traces from the working
// directory, else beside the module root.
func traceDir() (string, error) {
	tried := []string{filepath.Join("..", "shared", "traces"), trace.DefaultDir()}
	for _, d := range tried {
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			return d, nil
		}
	}
	return "", fmt.Errorf("trace directory not found (tried %s); pass --trace FILE", strings.Join(tried, ", "))
}

// readTrace reads a trace file in the given format (by extension when
// empty), keeping the first requests when requests > 0.
func readTrace(path, format string, requests int) (*trace.Workload, error) {
	var w *trace.Workload
	switch format {
	case "":
		var err error
		if w, err = trace.ReadFile(path); err != nil {
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

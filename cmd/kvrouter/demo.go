package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/demo"
	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/trace"
)

var demoHelp = help{
	synopsis: "kvrouter demo [flags]",
	about: "Starts emulated vLLM replicas and the router in this process (real HTTP, SSE and\n" +
		"ZMQ on loopback, time-scaled), replays the same workload through it once per policy,\n" +
		"each on a cold fleet: conversations after a shared system prompt, question sessions\n" +
		"over documents shared across sessions, and a hot agent session one replica cannot\n" +
		"carry. It compares the policies by what the engines report: prefill work and hit\n" +
		"rate (usage.cached_tokens, their own counters), requests per replica, and latencies\n" +
		"on the engines' model clocks, which a busy host does not stretch. Prints a table,\n" +
		"the verdict (lowest mean TTFT, as the HTML report's first line) and a plain-language\n" +
		"reading of why, and writes an HTML report. No GPU needed; about a minute.",
	examples: []string{
		"kvrouter demo",
		"kvrouter demo --policies all --requests 120          # every policy, shorter runs",
		"kvrouter demo --workload shared-prefix --replicas 8 --report demo.html",
	},
}

// demoPolicies parses --policies: comma-separated names, or all (every
// policy route.New knows).
func demoPolicies(s string) ([]string, error) {
	if strings.TrimSpace(s) == "all" {
		return route.Names(), nil
	}
	var names []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if _, err := route.New(p); err != nil {
			return nil, err
		}
		names = append(names, p)
	}
	return names, nil
}

// runDemo runs the live demo: emulated replicas and the router in process,
// the same workload through each policy, a side-by-side table.
func runDemo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	var cfg demo.Config
	policies := fs.String("policies", strings.Join(demo.DefaultPolicies(), ","), "comma-separated policies, or all: "+strings.Join(route.Names(), ", "))
	fs.IntVar(&cfg.Replicas, "replicas", demo.DefaultReplicas, "emulated replicas")
	fs.StringVar(&cfg.Workload, "workload", demo.ChatWorkload, "workload: "+strings.Join(append([]string{demo.ChatWorkload}, trace.Names()...), ", "))
	fs.IntVar(&cfg.Requests, "requests", demo.DefaultRequests, "requests per policy")
	fs.Float64Var(&cfg.TimeScale, "time-scale", 0, fmt.Sprintf("wall seconds per model second (0.1 runs 10x faster than real time); 0: %g, or %g when the host is busy (timers late by more than 5 ms at p99 over a second)", demo.DefaultTimeScale, demo.BusyTimeScale))
	fs.StringVar(&cfg.Preset, "preset", engine.DefaultPreset, "engine preset of the replicas")
	fs.IntVar(&cfg.KVBlocks, "kv-blocks", 0, "KV capacity per replica in blocks of 16 tokens; 0: the preset's")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "workload seed")
	htmlOut := fs.String("report", "kvrouter-demo.html", "write the HTML report here; empty: none")
	asJSON := fs.Bool("json", false, "print the report's JSON instead of the table")
	err := parseFlags(fs, args, demoHelp, os.Stderr)
	if err != nil {
		return err
	}
	if cfg.Policies, err = demoPolicies(*policies); err != nil {
		return err
	}
	n := len(cfg.Policies)
	if n == 0 {
		n = len(demo.DefaultPolicies())
	}
	req := cfg.Requests
	if req <= 0 {
		req = demo.DefaultRequests
	}
	cfg.Progress = report.NewProgress(os.Stderr, "demo", int64(n*req))
	start := time.Now()
	res, err := demo.Run(ctx, cfg)
	cfg.Progress.Done()
	if err != nil {
		return err
	}
	if *htmlOut != "" {
		if err := writeFile(*htmlOut, func(f io.Writer) error { return report.WriteHTML(f, res.Run()) }); err != nil {
			return err
		}
	}
	if *asJSON {
		return report.WriteJSON(os.Stdout, res.Run())
	}
	if err := res.WriteTable(os.Stdout); err != nil {
		return err
	}
	fmt.Printf("\nVerdict: %s\n\n%s\n", res.Verdict(), res.Reading())
	if res.Sizing != nil {
		fmt.Printf("\n%s\n", res.Sizing.Line())
	}
	fmt.Printf("\nwall time %v", time.Since(start).Round(100*time.Millisecond))
	if *htmlOut != "" {
		fmt.Printf("; report written to %s", *htmlOut)
	}
	fmt.Println()
	return nil
}

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/demo"
	"github.com/kvrouter/kvrouter/loadgen"
	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/trace"
)

var replayHelp = help{
	synopsis: "kvrouter replay --target URL [flags]",
	about: "Replays a workload against any OpenAI-compatible endpoint (kvrouter, vLLM, SGLang)\n" +
		"as streaming chat completions with real text synthesised from the workload, and\n" +
		"measures TTFT, ITL and end-to-end latency from the SSE stream and cached tokens\n" +
		"from usage. Open loop by arrival times (--rate rescales them), or closed loop\n" +
		"with --concurrency. Stops after --requests or --duration.",
	examples: []string{
		"kvrouter replay --target http://127.0.0.1:8000 --workload demo-chat --requests 100",
		"kvrouter replay --target http://10.0.0.1:8000 --workload multi-turn-chat --concurrency 16 --json",
		"kvrouter replay --target http://127.0.0.1:8000 --trace conversation_trace.jsonl --rate 4 --report replay.html",
	},
}

// runReplay replays a workload against an OpenAI-compatible endpoint and
// prints what the client measured.
func runReplay(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	target := fs.String("target", "http://127.0.0.1:8000", "endpoint base URL")
	workload := fs.String("workload", "multi-turn-chat", "workload: "+strings.Join(knownWorkloads(), ", "))
	traceFile := fs.String("trace", "", "read the requests from this trace file instead of --workload (Mooncake JSONL, a kvrouter recording, Azure CSV); a comma-separated list or a quoted glob reads several as one trace in time order")
	traceFormat := fs.String("trace-format", "", "format of --trace: mooncake (JSONL) or azure (CSV); empty: by extension")
	rate := fs.Float64("rate", 0, "open loop: rescale arrivals to this many requests/s; 0: the workload's own times")
	conc := fs.Int("concurrency", 0, "closed loop: this many clients back to back (overrides --rate)")
	requests := fs.Int("requests", 200, "requests to send (0: the whole workload)")
	duration := fs.Duration("duration", loadgen.DefaultDuration, "stop after this much wall time")
	timeout := fs.Duration("timeout", loadgen.DefaultRequestTimeout, "per-request timeout")
	model := fs.String("model", "", "model name; empty: the first one /v1/models lists")
	scale := fs.Float64("time-scale", 1, "wall seconds per model second of the target (an emulated engine's --time-scale); latencies are divided by it")
	maxTokens := fs.Int("max-tokens", 0, "cap on output tokens per request; 0: the workload's")
	ignoreEOS := fs.Bool("ignore-eos", true, `send "ignore_eos": true so every request generates its full length (vLLM, SGLang)`)
	header := fs.String("session-header", loadgen.DefaultSessionHeader, "header carrying the session id")
	label := fs.String("label", "", "row name in the table; empty: the target")
	seed := fs.Uint64("seed", 1, "workload seed")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	htmlOut := fs.String("report", "", "write an HTML report to this file")
	if err := parseFlags(fs, args, replayHelp, os.Stderr); err != nil {
		return err
	}
	reqs, name, err := replayWorkload(*workload, *traceFile, *traceFormat, *seed, *requests)
	if err != nil {
		return err
	}
	cfg := loadgen.Config{
		Target: strings.TrimRight(*target, "/"), Model: *model, Requests: reqs, MaxRequests: *requests, Rate: *rate, Concurrency: *conc,
		Duration: *duration, RequestTimeout: *timeout, TimeScale: *scale, MaxTokens: *maxTokens,
		IgnoreEOS: *ignoreEOS, SessionHeader: *header, SystemSegments: systemSegments(name),
		Parallel: parallelSteps(name),
	}
	bar := report.NewProgress(os.Stderr, "replaying", int64(len(reqs)))
	cfg.OnDone = func(loadgen.Sample) { bar.Add(1) }
	res, err := loadgen.Run(ctx, cfg)
	bar.Done()
	if err != nil {
		return err
	}
	row := *label
	if row == "" {
		row = cfg.Target
	}
	run := replayRun(res, row, name, cfg)
	if *htmlOut != "" {
		if err := writeFile(*htmlOut, func(f io.Writer) error { return report.WriteHTML(f, run) }); err != nil {
			return err
		}
	}
	if *asJSON {
		return report.WriteJSON(os.Stdout, run)
	}
	if err := report.WriteTable(os.Stdout, run); err != nil {
		return err
	}
	printErrors(os.Stdout, res)
	return nil
}

// replayWorkload builds the requests: a trace file or a workload of
// loadWorkload (the demo's included), as kvrouter sim reads them.
func replayWorkload(name, file, format string, seed uint64, n int) ([]trace.Request, string, error) {
	if file == "" && !slices.Contains(knownWorkloads(), name) {
		return nil, "", fmt.Errorf("unknown workload %q (known: %s)", name, strings.Join(knownWorkloads(), ", "))
	}
	w, err := loadWorkload(name, file, format, seed, n, 0)
	if err != nil {
		return nil, "", err
	}
	return w.Requests, w.Name, nil
}

// parallelSteps says which of a workload's requests go out at their
// arrival without waiting for their session's previous one, as the
// simulator sends them: the demo's agent steps, parallel calls in one
// session, as kvrouter demo sends them; nil (every turn waits) for the
// rest.
func parallelSteps(workload string) func(*trace.Request) bool {
	if workload == demo.ChatWorkload {
		return demo.Parallel
	}
	return nil
}

// systemSegments is how many leading segments make a workload's system
// message: the agentic workload's tool schemas and tenant instructions.
func systemSegments(workload string) int {
	if workload == "agentic" {
		return 2
	}
	return 1
}

// replayRun turns a replay into a report.Run with one row.
func replayRun(res *loadgen.Result, row, workload string, cfg loadgen.Config) *report.Run {
	t := res.Totals()
	mode := "open loop"
	switch {
	case cfg.Concurrency > 0:
		mode = fmt.Sprintf("closed loop, %d clients", cfg.Concurrency)
	case cfg.Rate > 0:
		mode = fmt.Sprintf("open loop, %g req/s", cfg.Rate)
	}
	return &report.Run{Title: "kvrouter replay", Params: []report.Param{
		{Name: "target", Value: cfg.Target},
		{Name: "workload", Value: workload},
		{Name: "mode", Value: mode},
		{Name: "requests", Value: fmt.Sprintf("%d sent, %d skipped", t.Requests, res.Skipped)},
		{Name: "time scale", Value: fmt.Sprint(res.TimeScale)},
		{Name: "wall time", Value: res.Wall.Round(time.Millisecond).String()},
	}, Policies: []report.Result{res.Summarize(row, nil, report.SLO{})}}
}

// printErrors prints failed requests by kind, and requests per replica
// when the endpoint named them.
func printErrors(w io.Writer, res *loadgen.Result) {
	t := res.Totals()
	if len(t.Errors) > 0 || res.Skipped > 0 {
		kinds := make([]string, 0, len(t.Errors))
		for k, n := range t.Errors {
			kinds = append(kinds, fmt.Sprintf("%s: %d", k, n))
		}
		slices.Sort(kinds)
		fmt.Fprintf(w, "\nerrors: %s; not sent (duration or interrupt): %d\n", strings.Join(kinds, ", "), res.Skipped)
	}
	if len(t.Replicas) == 1 && t.Replicas[""] > 0 {
		fmt.Fprintln(w, "\nno "+loadgen.HeaderReplica+" in the answers: a kvrouter sends it only with --client-headers (or an API key with headers=on)")
	}
	if len(t.Replicas) > 1 || (len(t.Replicas) == 1 && t.Replicas[""] == 0) {
		names := make([]string, 0, len(t.Replicas))
		for r := range t.Replicas {
			names = append(names, r)
		}
		slices.Sort(names)
		fmt.Fprintln(w, "\nrequests per replica ("+loadgen.HeaderReplica+"):")
		for _, r := range names {
			fmt.Fprintf(w, "  %-40s %d\n", r, t.Replicas[r])
		}
	}
}

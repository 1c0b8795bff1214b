// Command kvrouter is a KV-cache-aware request router for LLM serving
// fleets, with an emulated engine, a fleet simulator and a live demo.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one subcommand: it parses its own flags from args.
type command struct {
	summary string
	run     func(ctx context.Context, args []string) error
	// signals: the command handles SIGINT and SIGTERM itself (serve
	// drains); else its context ends at the first one.
	signals bool
	// hidden: not listed by kvrouter -h (a developer's command).
	hidden bool
}

func commands() map[string]command {
	return map[string]command{
		"serve":     {summary: "run the router in front of replicas", run: runServe, signals: true},
		"epp":       {summary: "run as a Gateway API endpoint picker (Envoy ext_proc, gRPC)", run: runEPP},
		"sim":       {summary: "simulate a fleet under several routing policies, side by side", run: runSim},
		"plan":      {summary: "size a fleet at an SLO on a trace: capacity and replicas needed per policy", run: runPlan},
		"version":   {summary: "print the version, commit and Go toolchain of this build", run: runVersion},
		"engine":    {summary: "run an emulated vLLM-compatible replica", run: runEngine},
		"calibrate": {summary: "measure a live engine's prefill and decode speed and write a preset file", run: runCalibrate},
		"demo":      {summary: "show the policies side by side on an in-process emulated fleet", run: runDemo},
		"replay":    {summary: "replay a workload against an OpenAI-compatible endpoint and measure it", run: runReplay},
		"gendocs":   {summary: "write docs/configuration.md and docs/metrics.md", run: runGendocs, hidden: true},
	}
}

func main() {
	cmds := commands()
	if len(os.Args) == 3 && os.Args[1] == "help" && cmds[os.Args[2]].run != nil {
		os.Args = []string{os.Args[0], os.Args[2], "-h"} // "kvrouter help sim" is "kvrouter sim -h"
	}
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage(cmds)
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	name := os.Args[1]
	if name == "--version" || name == "-version" {
		name = "version"
	}
	c, ok := cmds[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "kvrouter: unknown command %q\n\n", name)
		usage(cmds)
		os.Exit(2)
	}
	if name != "serve" { // serve logs them (logUnknownEnv), in its log's format
		for _, w := range envWarnings(os.Environ(), knownEnv()) {
			fmt.Fprintln(os.Stderr, "kvrouter: warning:", w)
		}
	}
	ctx, stop := context.Background(), func() {}
	if !c.signals {
		ctx, stop = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	}
	err := c.run(ctx, os.Args[2:])
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if r := (*flagSetRequest)(nil); errors.As(err, &r) {
		writeFlagDocs(os.Stdout, name, r.fs)
		return
	}
	if ue := (*usageError)(nil); errors.As(err, &ue) {
		fmt.Fprintf(os.Stderr, "kvrouter %s: %v\nRun 'kvrouter %s -h' for its flags and examples.\n", name, err, name)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvrouter %s: %v\n", name, err)
		os.Exit(1)
	}
}

func usage(cmds map[string]command) {
	fmt.Fprintln(os.Stderr, "usage: kvrouter <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		if cmds[n].hidden {
			continue
		}
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-8s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintln(os.Stderr, "\nexamples:")
	for _, e := range []string{
		"kvrouter demo                                   # 4 emulated replicas, 4 policies, side by side",
		"kvrouter sim --workload demo-chat --replicas 4  # the same comparison on a virtual clock, in seconds",
		"kvrouter serve --backend http://10.0.0.1:8000 --backend http://10.0.0.2:8000",
	} {
		fmt.Fprintln(os.Stderr, "  "+e)
	}
	fmt.Fprintln(os.Stderr, "\nRun 'kvrouter <command> -h' for what a command does, its flags and examples;")
	fmt.Fprintln(os.Stderr, "'kvrouter --version' for the build.")
}

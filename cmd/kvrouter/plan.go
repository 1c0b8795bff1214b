package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/sim"
	"github.com/kvrouter/kvrouter/trace"
)

// planPolicies is plan's default --policies: the default policy, the
// load-only and session-only ones it is judged against, and round-robin,
// the baseline of "saved".
const planPolicies = "kv-aware,least-loaded,session-hash,round-robin"

// simDefaultLoad is kvrouter sim's default --load, plan's 1× on a
// built-in workload.
const simDefaultLoad = 0.8

var planHelp = help{
	synopsis: "kvrouter plan [flags]",
	about: "Sizes a fleet at an SLO on a trace (--trace FILE, e.g. a recording) or a built-in\n" +
		"workload, per routing policy, with the simulator (seconds per run, no GPU). For\n" +
		"each policy: the most traffic --replicas replicas serve with --attainment of\n" +
		"the requests meeting the SLO (the capacity search of sim --capacity), as a\n" +
		"multiple of the trace's own arrival rate; and the fewest replicas that serve the\n" +
		"trace's traffic (or --rate-scale times it) so, searched over the replica count.\n" +
		"It prints a table (capacity ×, replicas needed, replicas saved against\n" +
		"round-robin, the SLO bound that breaks first), --json for machines, --report an\n" +
		"HTML page with each policy's attainment against load and against replicas.",
	examples: []string{
		"kvrouter plan --workload shared-prefix --requests 400 --replicas 8",
		"kvrouter plan --trace recording.jsonl --slo-ttft 500ms --slo-itl 50ms --report plan.html",
		"kvrouter plan --trace recording.jsonl --rate-scale 2 --policies all --json > plan.json   # twice the traffic",
		"kvrouter plan --workload all --replicas 16 --requests 1000   # every built-in workload",
	},
}

// runPlan is "kvrouter plan".
func runPlan(ctx context.Context, args []string) error {
	return planCommand(ctx, args, os.Stdout, os.Stderr)
}

// planCommand is kvrouter plan writing its result to stdout, and flag
// errors, notes and the progress bar (when it is a terminal) to stderr.
func planCommand(ctx context.Context, args []string, stdout io.Writer, stderr *os.File) error {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	workload := fs.String("workload", "shared-prefix", "workload, comma-separated workloads, or all (a trace workload whose file is missing is then skipped): "+strings.Join(knownWorkloads(), ", "))
	traceFile := fs.String("trace", "", "read the requests from this trace file (Mooncake JSONL, e.g. a recording, or Azure CSV) instead of --workload")
	traceFormat := fs.String("trace-format", "", "format of --trace: mooncake (JSONL) or azure (CSV); empty: by extension")
	requests := fs.Int("requests", 0, "number of requests per workload, the first of a trace (0: the workload's default or the whole trace)")
	seed := fs.Uint64("seed", 1, "seed of the workload generator and the policies' tie-breaks")
	replicas := fs.Int("replicas", 16, "replicas of the fleet whose capacity is searched")
	preset := fs.String("preset", engine.DefaultPreset, "engine preset: "+strings.Join(engine.Presets(), ", "))
	presetFileFlag(fs, preset)
	policies := fs.String("policies", planPolicies, "comma-separated policies, or all (every policy plus kv-aware-precise): "+strings.Join(route.Names(), ", "))
	rateScale := fs.Float64("rate-scale", 1, "size the fleet for this multiple of the trace's own arrival rate")
	attainment := fs.Float64("attainment", sim.DefaultLevels[0], "share of requests, 0..1, that must meet the SLO")
	sloTTFT := fs.Duration("slo-ttft", 0, "SLO: time to first token (0: derived as by kvrouter sim: the 99th-percentile prompt's uncached prefill on an idle replica plus 4× the median's)")
	sloITL := fs.Duration("slo-itl", 0, "SLO: mean inter-token latency (0: 5× one decode step of a batch of one at the median prompt)")
	load := fs.Float64("load", -1, "make 1× (what capacity and --rate-scale multiply) this multiple of the --replicas fleet's knee rate, as kvrouter sim --load, instead of the workload's own arrival rate (-1: the own rate of a --trace; for a built-in workload, whose generated rate is arbitrary, sim's default load "+fmt.Sprint(simDefaultLoad)+")")
	tolerance := fs.Float64("tolerance", sim.DefaultTolerance, "relative step of the grid of loads the capacity search runs on")
	maxReplicas := fs.Int("max-replicas", 0, "most replicas the fewest-replicas search tries (0: 4× --replicas, at least 64)")
	asJSON := fs.Bool("json", false, "print JSON instead of a table (one object, an array for several workloads)")
	htmlOut := fs.String("report", "", "write a self-contained HTML report to this file")
	adm := fleet.Admission{MaxWait: fleet.DefaultMaxWait, MaxQueue: fleet.DefaultMaxQueue, QueueTimeout: fleet.DefaultQueueTimeout}
	admissionFlags(fs, &adm.MaxWait, &adm.MaxQueue, &adm.QueueTimeout)
	if err := parseFlags(fs, args, planHelp, stderr); err != nil {
		return err
	}
	ps := sim.PlanSearch{Attainment: *attainment, RateScale: *rateScale, Load: *load, Tolerance: *tolerance, MaxReplicas: *maxReplicas}
	switch {
	case ps.Load == -1 && *traceFile != "":
		ps.Load = 0
	case ps.Load == -1:
		ps.Load = simDefaultLoad
	case ps.Load < 0:
		return &usageError{cmd: "plan", err: fmt.Errorf("--load %g: want a positive multiple of the knee, 0 (the own rate) or -1 (the default)", ps.Load)}
	}
	if err := checkPlanFlags(ps, *replicas, *sloTTFT < 0 || *sloITL < 0); err != nil {
		return &usageError{cmd: "plan", err: err}
	}
	cfg, err := engine.Preset(*preset)
	if err != nil {
		return &usageError{cmd: "plan", err: err}
	}
	ws, err := simWorkloads(*workload, *traceFile, *traceFormat, *seed, *requests, sim.FleetKVTokens(cfg, *replicas), stderr)
	if err != nil {
		return err
	}
	base := sim.Config{
		Replicas: *replicas, PresetName: *preset, Preset: cfg, Policies: policyNames(*policies, false),
		Seed: *seed, SLO: sim.SLO{TTFT: *sloTTFT, ITL: *sloITL}, Admission: adm, Cancel: ctx.Done(),
	}
	plans, err := plans(base, ws, ps, *traceFile != "", stderr)
	if err != nil {
		return err
	}
	return planWriters(plans).write(stdout, *htmlOut, *asJSON)
}

// checkPlanFlags rejects flag values the search cannot take, with the
// flag's name.
func checkPlanFlags(ps sim.PlanSearch, replicas int, negativeSLO bool) error {
	switch {
	case !(ps.Attainment > 0 && ps.Attainment <= 1):
		return fmt.Errorf("--attainment %g: want a share of requests in (0, 1], e.g. 0.99", ps.Attainment)
	case !(ps.RateScale > 0):
		return fmt.Errorf("--rate-scale %g: want a positive multiple of the trace's rate", ps.RateScale)
	case replicas < 1:
		return fmt.Errorf("--replicas %d: want at least 1", replicas)
	case ps.MaxReplicas < 0:
		return fmt.Errorf("--max-replicas %d: want at least 1 (0: the default)", ps.MaxReplicas)
	case !(ps.Tolerance > 0):
		return fmt.Errorf("--tolerance %g: want a positive step, e.g. 0.02", ps.Tolerance)
	case negativeSLO:
		return errors.New("--slo-ttft and --slo-itl must not be negative (0: derived)")
	}
	return nil
}

// plans sizes the fleet on every workload, with one progress bar across
// them on stderr when it is a terminal.
func plans(base sim.Config, ws []*trace.Workload, ps sim.PlanSearch, fromTrace bool, stderr *os.File) ([]report.Plan, error) {
	// About a dozen runs a policy for its capacity, a few for its replicas.
	bar := report.NewProgress(stderr, "plan", int64(len(ws)*len(base.Policies)*16))
	defer bar.Done()
	var out []report.Plan
	for _, w := range ws {
		c := base
		c.Workload, c.Requests, c.Fleet = w.Name, w.Requests, w.Events
		ps.Progress = func(policy, run string) {
			bar.SetLabel(fmt.Sprintf("%s %s %s", w.Name, policy, run))
			bar.Add(1)
		}
		p, err := sim.Plan(c, ps)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", w.Name, err)
		}
		if fromTrace {
			p.Source = "trace"
		}
		out = append(out, p)
	}
	return out, nil
}

// planWriters write plans: a table (and its intro) per workload, JSON
// (one object, an array for several), or the HTML page.
func planWriters(ps []report.Plan) writers {
	return writers{
		html: func(w io.Writer) error { return report.WritePlanHTML(w, ps) },
		json: func(w io.Writer) error {
			if len(ps) == 1 {
				return report.WritePlanJSON(w, &ps[0])
			}
			return report.WritePlansJSON(w, ps)
		},
		table: func(w io.Writer) error {
			for i := range ps {
				if len(ps) > 1 {
					if _, err := fmt.Fprintf(w, "\n== %s\n", ps[i].Params[0].Value); err != nil {
						return err
					}
				}
				if err := report.WritePlanTable(w, &ps[i]); err != nil {
					return err
				}
			}
			return nil
		},
	}
}

package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/sim"
	"github.com/kvrouter/kvrouter/trace"
)

// parseLoads parses --load: one fraction or comma-separated fractions.
func parseLoads(s string) ([]float64, error) {
	var loads []float64
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		l, err := strconv.ParseFloat(f, 64)
		if err != nil || l < 0 {
			return nil, fmt.Errorf("load %q: want a fraction of capacity ≥ 0", f)
		}
		if !slices.Contains(loads, l) {
			loads = append(loads, l)
		}
	}
	if len(loads) == 0 {
		return nil, errors.New("no --load given")
	}
	return loads, nil
}

// simWorkloads loads --trace, or each workload of --workload: a name,
// comma-separated names, or all. With all, a trace workload whose file is
// missing is skipped with a note on stderr; named, it is an error. kvTokens
// sizes the workloads that scale with the fleet (see loadWorkload).
func simWorkloads(list, file, format string, seed uint64, requests, kvTokens int, stderr io.Writer) ([]*trace.Workload, error) {
	if file != "" {
		w, err := loadWorkload("", file, format, seed, requests, 0)
		if err != nil {
			return nil, err
		}
		return []*trace.Workload{w}, nil
	}
	names, all := workloadNames(list)
	if len(names) == 0 {
		return nil, errors.New("no --workload given")
	}
	for _, n := range names {
		if !slices.Contains(knownWorkloads(), n) {
			return nil, fmt.Errorf("unknown workload %q (known: %s, or all)", n, strings.Join(knownWorkloads(), ", "))
		}
	}
	var ws []*trace.Workload
	for _, n := range names {
		w, err := loadWorkload(n, "", "", seed, requests, kvTokens)
		switch {
		case all && errors.Is(err, os.ErrNotExist):
			first, _, _ := strings.Cut(err.Error(), "\n") // "workload NAME: ..."; named alone, it says where to get it
			fmt.Fprintf(stderr, "kvrouter sim: skipping %s\n", first)
		case err != nil:
			return nil, err
		default:
			ws = append(ws, w)
		}
	}
	if len(ws) == 0 {
		return nil, errors.New("no workload to run: every trace file is missing (pass --trace FILE)")
	}
	return ws, nil
}

// workloadNames parses --workload, and reports whether it was all.
func workloadNames(list string) ([]string, bool) {
	if strings.TrimSpace(list) == "all" {
		return trace.Names(), true
	}
	var names []string
	for _, n := range strings.Split(list, ",") {
		if n = strings.TrimSpace(n); n != "" && !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names, false
}

// cells returns one simulation per (workload, load), workloads first.
func cells(base sim.Config, ws []*trace.Workload, loads []float64) []sim.Config {
	var cs []sim.Config
	for _, w := range ws {
		for _, l := range loads {
			c := base
			c.Workload, c.Requests, c.Fleet, c.Load = w.Name, w.Requests, w.Events, l
			cs = append(cs, c)
		}
	}
	return cs
}

// runCells runs every cell, with one progress bar across them on stderr
// when it is a terminal.
func runCells(cs []sim.Config, stderr *os.File) ([]report.Run, error) {
	var total int64
	for _, c := range cs {
		total += int64(len(c.Requests) * len(c.Policies))
	}
	bar := report.NewProgress(stderr, "simulating", total)
	defer bar.Done()
	var runs []report.Run
	for _, c := range cs {
		label := func(policy string) string { return policy }
		if len(cs) > 1 {
			label = func(policy string) string { return fmt.Sprintf("%s @ %g %s", c.Workload, c.Load, policy) }
		}
		if bar != nil {
			last := 0
			c.Progress = func(policy string, done, _ int) {
				if done < last {
					last = 0 // the next policy started
				}
				bar.SetLabel(label(policy))
				bar.Add(int64(done - last))
				last = done
			}
		}
		run, err := sim.Run(c)
		if err != nil {
			if len(cs) > 1 {
				err = fmt.Errorf("%s at load %g: %w", c.Workload, c.Load, err)
			}
			return nil, err
		}
		runs = append(runs, run)
	}
	return runs, nil
}

// boardWriters write a leaderboard.
func boardWriters(b *report.Board) writers {
	return writers{
		html:  func(w io.Writer) error { return report.WriteBoardHTML(w, b) },
		json:  func(w io.Writer) error { return report.WriteBoardJSON(w, b) },
		table: func(w io.Writer) error { return report.WriteBoardTable(w, b) },
	}
}

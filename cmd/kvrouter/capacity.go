package main

import (
	"fmt"
	"io"
	"os"

	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/sim"
	"github.com/kvrouter/kvrouter/trace"
)

// runCapacity is kvrouter sim --capacity: every policy's capacity at the
// SLO on every workload (capacities), on every split of the fleet,
// written as tables, JSON (one object per workload, an array for
// several) or an HTML page.
func runCapacity(base sim.Config, ws []*trace.Workload, splits []int, policies string, cs sim.CapacitySearch, stdout io.Writer, stderr *os.File, htmlOut string, asJSON bool) error {
	caps, err := capacities(base, ws, splits, policies, cs, stderr)
	if err != nil {
		return err
	}
	ws2 := writers{
		html: func(w io.Writer) error { return report.WriteCapacityHTML(w, caps) },
		json: func(w io.Writer) error {
			if len(caps) == 1 {
				return report.WriteCapacityJSON(w, &caps[0])
			}
			return report.WriteCapacitiesJSON(w, caps)
		},
		table: func(w io.Writer) error {
			for i := range caps {
				if len(caps) > 1 {
					if _, err := fmt.Fprintf(w, "\n== %s\n", caps[i].Params[0].Value); err != nil {
						return err
					}
				}
				if err := report.WriteCapacityTable(w, &caps[i]); err != nil {
					return err
				}
			}
			return nil
		},
	}
	return ws2.write(stdout, htmlOut, asJSON)
}

// capacities searches every policy's capacity at the SLO on every
// workload, one search per workload and split of the fleet (several
// splits, as --prefill-replicas 0,4,8 gives them, are merged into one
// result per workload: mergeSplitCapacities), with one progress bar
// across them on stderr when it is a terminal.
func capacities(base sim.Config, ws []*trace.Workload, splits []int, policies string, cs sim.CapacitySearch, stderr *os.File) ([]report.Capacity, error) {
	// About a dozen runs a policy: a bracket and a bisection.
	bar := report.NewProgress(stderr, "capacity", int64(len(ws)*len(splits)*len(base.Policies)*12))
	defer bar.Done()
	var caps []report.Capacity
	for _, w := range ws {
		c := base
		c.Workload, c.Requests, c.Fleet = w.Name, w.Requests, w.Events
		cfgs := []sim.Config{c}
		if len(splits) > 1 {
			cfgs = splitCells(cfgs, splits, policies)
		}
		var each []report.Capacity
		for _, c := range cfgs {
			cs.Progress = func(policy string, load float64) {
				bar.SetLabel(fmt.Sprintf("%s %s @ %.3g", w.Name, splitName(policy, c.PrefillReplicas, c.Replicas), load))
				bar.Add(1)
			}
			cp, err := sim.Capacity(c, cs)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", w.Name, err)
			}
			each = append(each, cp)
		}
		if len(splits) > 1 {
			each = []report.Capacity{mergeSplitCapacities(each, splits, c.Replicas)}
		}
		caps = append(caps, each...)
	}
	return caps, nil
}

package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/route"
	"github.com/kvrouter/kvrouter/sim"
	"github.com/kvrouter/kvrouter/trace"
)

// yardstick is how kvrouter sim --capacity repeats its search: once per
// SLO of slos (each under every seed) and per seed of seeds (each
// regenerating the workloads with workloads(seed)).
type yardstick struct {
	seeds     []uint64
	slos      []sim.SLO
	workloads func(seed uint64) ([]*trace.Workload, error)
}

// runCapacity is kvrouter sim --capacity: every policy's capacity at the
// SLO on every workload (capacities), on every split of the fleet,
// written as tables, JSON (one object per workload, an array for
// several) or an HTML page. With several seeds or SLOs (y), each
// workload and SLO is summarized over the seeds (report.CapacitySeeds):
// the table gives the summaries, JSON an array of them, the HTML page
// every search.
func runCapacity(base sim.Config, y yardstick, splits []int, policies string, cs sim.CapacitySearch, stdout io.Writer, stderr *os.File, htmlOut string, asJSON bool) error {
	if len(y.seeds) == 1 && len(y.slos) == 1 {
		ws, err := y.workloads(y.seeds[0])
		if err != nil {
			return err
		}
		base.SLO = y.slos[0]
		caps, err := capacities(base, ws, splits, policies, cs, stderr)
		if err != nil {
			return err
		}
		warnShort(stderr, caps)
		return capacityWriters(caps).write(stdout, htmlOut, asJSON)
	}
	sums, all, err := seedCapacities(base, y, splits, policies, cs, stderr)
	if err != nil {
		return err
	}
	warnShort(stderr, all)
	ws := writers{
		html: func(w io.Writer) error { return report.WriteCapacityHTML(w, all) },
		json: func(w io.Writer) error { return report.WriteCapacitySeedsJSON(w, sums) },
		table: func(w io.Writer) error {
			for i := range sums {
				if _, err := fmt.Fprintf(w, "\n== %s\n", sums[i].Workload); err != nil {
					return err
				}
				if err := report.WriteCapacitySeedsTable(w, &sums[i]); err != nil {
					return err
				}
			}
			return nil
		},
	}
	return ws.write(stdout, htmlOut, asJSON)
}

// capacityWriters write one search per workload.
func capacityWriters(caps []report.Capacity) writers {
	return writers{
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
}

// seedCapacities runs the search under every SLO and seed of y, and
// summarizes each workload and SLO over the seeds, with the default
// policy's ratio to the best other; all is every search, titled by its
// seed and SLO.
func seedCapacities(base sim.Config, y yardstick, splits []int, policies string, cs sim.CapacitySearch, stderr *os.File) (sums []report.CapacitySeeds, all []report.Capacity, err error) {
	type key struct {
		workload string
		slo      int
	}
	runs := map[key][]report.Capacity{}
	var order []key
	for _, seed := range y.seeds {
		ws, err := y.workloads(seed)
		if err != nil {
			return nil, nil, err
		}
		for k, slo := range y.slos {
			c := base
			c.Seed, c.SLO = seed, slo
			caps, err := capacities(c, ws, splits, policies, cs, stderr)
			if err != nil {
				return nil, nil, err
			}
			for i := range caps {
				kk := key{caps[i].Params[0].Value, k}
				if _, ok := runs[kk]; !ok {
					order = append(order, kk)
				}
				caps[i].Title += fmt.Sprintf(" (seed %d, SLO %s)", seed, sloText(slo))
				runs[kk] = append(runs[kk], caps[i])
				all = append(all, caps[i])
			}
		}
	}
	for _, k := range order {
		if len(runs[k]) != len(y.seeds) {
			return nil, nil, fmt.Errorf("workload %s ran under %d of the %d seeds", k.workload, len(runs[k]), len(y.seeds))
		}
		sums = append(sums, report.NewCapacitySeeds(runs[k], y.seeds, route.Default))
	}
	return sums, all, nil
}

// warnShort warns, on stderr, of each search whose run was shorter than
// a steady state at its highest capacity needs.
func warnShort(stderr io.Writer, caps []report.Capacity) {
	for i := range caps {
		if c := &caps[i]; c.Short() {
			fmt.Fprintf(stderr, "kvrouter sim: %s: %d requests are short of a steady state at the highest capacity found, which needs %d (ten turnovers of the fleet's requests; docs/simulator.md); rerun with --requests %d\n",
				c.Title, c.Requests, c.SteadyRequests, c.SteadyRequests)
		}
	}
}

// sloText writes slo as --slo takes it: "derived", or TTFT/ITL with a
// zero bound derived.
func sloText(slo sim.SLO) string {
	if slo == (sim.SLO{}) {
		return "derived"
	}
	return slo.TTFT.String() + "/" + slo.ITL.String()
}

// parseSLOs parses --slo: comma-separated TTFT/ITL pairs of durations
// ("1s/50ms"), or "derived" for the SLO derived from the preset and the
// workload (sim.SLO's zero value; a zero bound of a pair is derived too).
func parseSLOs(s string) ([]sim.SLO, error) {
	var out []sim.SLO
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "derived" {
			out = append(out, sim.SLO{})
			continue
		}
		ttft, itl, ok := strings.Cut(part, "/")
		if !ok {
			return nil, fmt.Errorf("--slo %q: want TTFT/ITL (1s/50ms) or derived", part)
		}
		t, err := time.ParseDuration(strings.TrimSpace(ttft))
		if err != nil {
			return nil, fmt.Errorf("--slo %q: TTFT: %w", part, err)
		}
		i, err := time.ParseDuration(strings.TrimSpace(itl))
		if err != nil {
			return nil, fmt.Errorf("--slo %q: ITL: %w", part, err)
		}
		if t < 0 || i < 0 {
			return nil, fmt.Errorf("--slo %q: negative bound", part)
		}
		out = append(out, sim.SLO{TTFT: t, ITL: i})
	}
	if len(out) == 0 {
		return nil, errors.New("--slo: no SLO given")
	}
	return out, nil
}

// seedList is the n seeds from first on.
func seedList(first uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = first + uint64(i)
	}
	return out
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
			steady := 0
			for i := range each {
				steady = max(steady, each[i].SteadyRequests)
			}
			each = []report.Capacity{mergeSplitCapacities(each, splits, c.Replicas)}
			each[0].SteadyRequests = steady
		}
		caps = append(caps, each...)
	}
	return caps, nil
}

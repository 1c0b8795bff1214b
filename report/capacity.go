package report

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Capacity is a capacity-at-SLO search over one workload: per policy, the
// highest load at which a share of the requests (Levels, e.g. 99% and
// 90%) meet the SLO, and the attainment at every load the search ran.
type Capacity struct {
	// Title heads the HTML page; empty means "kvrouter capacity".
	Title  string  `json:"title,omitempty"`
	Params []Param `json:"params"`
	SLO    SLO     `json:"slo"`
	// KneeRate is the fleet's arrival rate at load 1, requests per
	// second; OwnRate the workload's own (0: it has no arrival times).
	KneeRate float64 `json:"knee_rate"`
	OwnRate  float64 `json:"own_rate"`
	// Tolerance is the relative step of the grid of loads searched: a
	// capacity C means C meets the level and C × (1 + Tolerance) does not.
	Tolerance float64 `json:"tolerance"`
	// Levels are the attainments searched for, 0..1, highest first.
	Levels   []float64        `json:"levels"`
	Policies []PolicyCapacity `json:"policies"`
	// Requests is the run's length; SteadyRequests the length a run
	// needs to reach a steady state at the highest load that decided a
	// capacity (sim/steady.go states the rule): a search whose
	// Requests fall short measured its highest capacities on a fleet
	// still filling up.
	Requests       int `json:"requests"`
	SteadyRequests int `json:"steady_requests"`
}

// Short reports whether the run was shorter than a steady state at its
// highest capacity needs.
func (c *Capacity) Short() bool { return c.Requests < c.SteadyRequests }

// PolicyCapacity is one policy's capacity.
type PolicyCapacity struct {
	Policy string `json:"policy"`
	// At is the capacity at each of Capacity.Levels, in their order.
	At []LevelCapacity `json:"at"`
	// Binding is what the requests past the first level's capacity miss
	// most: "ttft", "itl" or "rejected" ("" if nothing failed).
	Binding string `json:"binding"`
	// Curve is the attainment at every load run, by load.
	Curve []Attainment `json:"curve"`
}

// LevelCapacity is the capacity at one attainment level.
type LevelCapacity struct {
	Level float64 `json:"level"`
	// Load is the highest load meeting the level (0: none does, down to
	// the search's floor); Rate the fleet's arrival rate there, requests
	// per second; RateScale the multiple of the workload's own rate (0
	// when it has none).
	Load      float64 `json:"load"`
	Rate      float64 `json:"rate"`
	RateScale float64 `json:"rate_scale"`
	// Capped is true when the level was still met at the search's ceiling.
	Capped bool `json:"capped,omitempty"`
}

// Attainment is one run of a capacity search.
type Attainment struct {
	Load float64 `json:"load"`
	// Met is the share of requests meeting the SLO, 0..1; TTFTMissed,
	// ITLMissed the shares of completed requests over each bound (a
	// request may miss both); Rejected the share refused or failed.
	Met        float64 `json:"met"`
	TTFTMissed float64 `json:"ttft_missed"`
	ITLMissed  float64 `json:"itl_missed"`
	Rejected   float64 `json:"rejected"`
}

// NewAttainment counts samples against slo at load (a sample with an SLO
// class against its own bounds).
func NewAttainment(load float64, samples []Sample, slo SLO) Attainment {
	slo = slo.orDefault()
	a := Attainment{Load: load}
	var met, ttft, itl, rej int
	for _, s := range samples {
		if !s.OK {
			rej++
			continue
		}
		b := s.bounds(slo)
		okT, okI := s.TTFT <= b.TTFT, s.ITL <= b.ITL
		if !okT {
			ttft++
		}
		if !okI {
			itl++
		}
		if okT && okI {
			met++
		}
	}
	n := float64(max(len(samples), 1))
	a.Met, a.TTFTMissed, a.ITLMissed, a.Rejected = float64(met)/n, float64(ttft)/n, float64(itl)/n, float64(rej)/n
	return a
}

// binding names what a failed attainment misses most.
func (a Attainment) binding() string {
	switch {
	case a.Met >= 1:
		return ""
	case a.Rejected >= a.TTFTMissed && a.Rejected >= a.ITLMissed:
		return "rejected"
	case a.ITLMissed > a.TTFTMissed:
		return "itl"
	default:
		return "ttft"
	}
}

// Binding is what a the first attainment of curve below level misses
// most; "" when none is below.
func Binding(curve []Attainment, level float64) string {
	for _, a := range curve {
		if a.Met < level {
			return a.binding()
		}
	}
	return ""
}

// normalized rounds c's floats as the writers print them.
func (c *Capacity) normalized() Capacity {
	out := *c
	if out.Title == "" {
		out.Title = "kvrouter capacity"
	}
	out.KneeRate, out.OwnRate = round6(c.KneeRate), round6(c.OwnRate)
	out.Policies = make([]PolicyCapacity, len(c.Policies))
	for i, p := range c.Policies {
		p.At = append([]LevelCapacity(nil), p.At...)
		for k := range p.At {
			l := &p.At[k]
			l.Load, l.Rate, l.RateScale = round6(l.Load), round6(l.Rate), round6(l.RateScale)
		}
		p.Curve = append([]Attainment(nil), p.Curve...)
		for k := range p.Curve {
			a := &p.Curve[k]
			a.Load, a.Met, a.TTFTMissed, a.ITLMissed, a.Rejected = round6(a.Load), round6(a.Met), round6(a.TTFTMissed), round6(a.ITLMissed), round6(a.Rejected)
		}
		out.Policies[i] = p
	}
	if out.Params == nil {
		out.Params = []Param{}
	}
	return out
}

// WriteCapacityJSON writes c as indented JSON.
func WriteCapacityJSON(w io.Writer, c *Capacity) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	n := c.normalized()
	return enc.Encode(&n)
}

// reference is the policy the table's "× rr" column divides by.
const reference = "round-robin"

// WriteCapacityTable writes c as a table: one row per policy, its
// capacity at each level as a load and as requests per second, as a
// multiple of round-robin's (when round-robin ran) and the SLO bound it
// breaks first.
func WriteCapacityTable(w io.Writer, c *Capacity) error {
	n := c.normalized()
	fmt.Fprintf(w, "capacity at the SLO (TTFT ≤ %s, ITL ≤ %s): the highest load at which the share of requests meeting it is at least the level; load 1 = %.3g req/s (a balanced fleet caching nothing at its knee), tolerance %.0f%%\n",
		dur(Millis(n.SLO.orDefault().TTFT)), dur(Millis(n.SLO.orDefault().ITL)), n.KneeRate, 100*n.Tolerance)
	head, rows := capacityRows(&n, nil)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, row := range append([][]string{head}, rows...) {
		fmt.Fprintln(tw, strings.Join(append(row, ""), "\t"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if n.SteadyRequests > 0 {
		short := ""
		if n.Short() {
			short = ": too short, its highest capacities were measured on a fleet still filling up"
		}
		_, err := fmt.Fprintf(w, "run length %d requests; a steady state at the highest load that decided a capacity needs %d%s\n", n.Requests, n.SteadyRequests, short)
		return err
	}
	return nil
}

// capacityRows are the capacity table of a normalized c: a header and one
// row per policy with its capacity at each level as a load (≥ when
// capped) and in requests per second, as a multiple of round-robin's
// (when round-robin ran), its rank at the level when ranks (one standing
// per level) are given, and the bound it breaks first.
func capacityRows(c *Capacity, ranks []*Standing) (head []string, rows [][]string) {
	ref := -1
	for i, p := range c.Policies {
		if p.Policy == reference {
			ref = i
		}
	}
	head = []string{"policy"}
	for _, l := range c.Levels {
		head = append(head, fmt.Sprintf("load@%s", pctLevel(l)), "req/s")
		if ref >= 0 {
			head = append(head, "× rr")
		}
		if ranks != nil {
			head = append(head, "#")
		}
	}
	head = append(head, "binds")
	for _, p := range c.Policies {
		row := []string{p.Policy}
		for k, l := range p.At {
			load := fmt.Sprintf("%.3g", l.Load)
			if l.Capped {
				load = "≥" + load
			}
			row = append(row, load, fmt.Sprintf("%.3g", l.Rate))
			if ref >= 0 {
				row = append(row, ratioText(l.Load, c.Policies[ref].At[k].Load))
			}
			if ranks != nil {
				row = append(row, fmt.Sprint(ranks[k].Ranks[p.Policy]))
			}
		}
		rows = append(rows, append(row, or0(p.Binding, "-")))
	}
	return head, rows
}

// pctLevel writes a level as a percentage: 0.99 → "99%".
func pctLevel(l float64) string { return fmt.Sprintf("%g%%", round6(100*l)) }

// ratioText is a/b with two decimals, "-" when b is zero.
func ratioText(a, b float64) string {
	if b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", a/b)
}

// or0 is s, or def when s is empty.
func or0(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// WriteCapacitiesJSON writes several searches as one indented JSON array.
func WriteCapacitiesJSON(w io.Writer, cs []Capacity) error {
	out := make([]Capacity, len(cs))
	for i := range cs {
		out[i] = cs[i].normalized()
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

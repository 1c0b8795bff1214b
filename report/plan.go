package report

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Bases of Plan.Rate.
const (
	// BasisOwn: Rate is the requests' own mean arrival rate.
	BasisOwn = "own"
	// BasisKnee: Rate is the given fleet's rate at Plan.Load (1: the
	// fleet, balanced and caching nothing, at its knee).
	BasisKnee = "knee"
)

// Plan sizes a fleet at an SLO on one workload: per policy, the most
// traffic the given fleet serves with at least Attainment of the
// requests meeting the SLO, and the fewest replicas that serve RateScale
// times the workload's rate so.
type Plan struct {
	// Title heads the HTML page; empty means "kvrouter plan".
	Title  string  `json:"title,omitempty"`
	Params []Param `json:"params"`
	SLO    SLO     `json:"slo"`
	// Attainment is the share of requests, 0..1, that must meet the SLO.
	Attainment float64 `json:"attainment"`
	// Replicas is the given fleet, the one Capacity is of.
	Replicas int `json:"replicas"`
	// Rate is what the multiples (Capacity, RateScale) multiply, in
	// requests per second: the workload's own arrival rate (Basis
	// BasisOwn) or Load times the given fleet's knee rate (BasisKnee).
	Rate  float64 `json:"rate"`
	Basis string  `json:"basis"`
	Load  float64 `json:"load,omitempty"`
	// Source says what the workload is: "trace" (a file's requests and
	// times) or "workload" (a built-in generator's); empty means workload.
	Source string `json:"source"`
	// RateScale is the traffic the replica count is sized for, a
	// multiple of Rate.
	RateScale float64 `json:"rate_scale"`
	// MaxReplicas is the most replicas the search tried.
	MaxReplicas int `json:"max_replicas"`
	// Tolerance is the capacity search's relative step.
	Tolerance float64      `json:"tolerance"`
	Policies  []PolicyPlan `json:"policies"`
}

// PolicyPlan is one policy's plan.
type PolicyPlan struct {
	Policy string `json:"policy"`
	// Capacity is the most traffic the given fleet serves within the
	// SLO, a multiple of Plan.Rate (0: none down to the search's floor);
	// Capped is true when it was still served at the search's ceiling.
	Capacity float64 `json:"capacity"`
	Capped   bool    `json:"capped,omitempty"`
	// Binding is what the requests miss most past Capacity: "ttft",
	// "itl" or "rejected" ("" if nothing failed).
	Binding string `json:"binding"`
	// Needed is the fewest replicas that serve Plan.RateScale × Plan.Rate
	// within the SLO; 0 when even Plan.MaxReplicas do not.
	Needed int `json:"replicas_needed"`
	// Saved is round-robin's Needed less this policy's, when both were
	// found (nil otherwise, or without round-robin).
	Saved *int `json:"replicas_saved,omitempty"`
	// FleetBinding is what the requests miss most on one replica fewer
	// than Needed ("" when that was not run).
	FleetBinding string `json:"fleet_binding,omitempty"`
	// Load is the attainment at every traffic the capacity search ran
	// (Load a multiple of Plan.Rate), by load.
	Load []Attainment `json:"load"`
	// Fleet is the attainment at every replica count run, by count.
	Fleet []FleetAttainment `json:"fleet"`
}

// FleetAttainment is one run of the replica search: Replicas replicas at
// Plan.RateScale (Load).
type FleetAttainment struct {
	Replicas int `json:"replicas"`
	Attainment
}

// Compare fills each policy's Saved against round-robin's Needed.
func (p *Plan) Compare() {
	ref := p.policy(reference)
	for i := range p.Policies {
		q := &p.Policies[i]
		q.Saved = nil
		if ref != nil && ref.Needed > 0 && q.Needed > 0 {
			s := ref.Needed - q.Needed
			q.Saved = &s
		}
	}
}

// policy is the named policy's plan, or nil.
func (p *Plan) policy(name string) *PolicyPlan {
	for i := range p.Policies {
		if p.Policies[i].Policy == name {
			return &p.Policies[i]
		}
	}
	return nil
}

// normalized rounds p's floats as the writers print them.
func (p *Plan) normalized() Plan {
	out := *p
	if out.Title == "" {
		out.Title = "kvrouter plan"
	}
	if out.Source == "" {
		out.Source = "workload"
	}
	if out.Params == nil {
		out.Params = []Param{}
	}
	out.Rate, out.RateScale = round6(p.Rate), round6(p.RateScale)
	out.Policies = make([]PolicyPlan, len(p.Policies))
	for i, q := range p.Policies {
		q.Capacity = round6(q.Capacity)
		q.Load = append([]Attainment{}, q.Load...)
		for k := range q.Load {
			q.Load[k] = q.Load[k].rounded()
		}
		q.Fleet = append([]FleetAttainment{}, q.Fleet...)
		for k := range q.Fleet {
			q.Fleet[k].Attainment = q.Fleet[k].rounded()
		}
		out.Policies[i] = q
	}
	return out
}

// rounded is a with its floats rounded as the writers print them.
func (a Attainment) rounded() Attainment {
	a.Load, a.Met, a.TTFTMissed, a.ITLMissed, a.Rejected = round6(a.Load), round6(a.Met), round6(a.TTFTMissed), round6(a.ITLMissed), round6(a.Rejected)
	return a
}

// WritePlanJSON writes p as indented JSON.
func WritePlanJSON(w io.Writer, p *Plan) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	n := p.normalized()
	return enc.Encode(&n)
}

// WritePlansJSON writes several plans as one indented JSON array.
func WritePlansJSON(w io.Writer, ps []Plan) error {
	out := make([]Plan, len(ps))
	for i := range ps {
		out[i] = ps[i].normalized()
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// WritePlanTable writes p as a table after a line saying what it
// measures: one row per policy with its capacity, the replicas it needs,
// the replicas it saves against round-robin and the bound it breaks
// first.
func WritePlanTable(w io.Writer, p *Plan) error {
	n := p.normalized()
	if _, err := fmt.Fprintln(w, n.intro()); err != nil {
		return err
	}
	head, rows := planRows(&n)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, row := range append([][]string{head}, rows...) {
		fmt.Fprintln(tw, strings.Join(append(row, ""), "\t"))
	}
	return tw.Flush()
}

// intro says what the table of normalized p measures.
func (p *Plan) intro() string {
	slo := p.SLO.orDefault()
	return fmt.Sprintf("plan at the SLO (TTFT ≤ %s, mean ITL ≤ %s) met by %s of requests, %s; %s\n"+
		"capacity: the most traffic %d replicas serve so, as a multiple of %s (tolerance %g%%); replicas: the fewest that serve %g× it (searched up to %d)",
		dur(Millis(slo.TTFT)), dur(Millis(slo.ITL)), pctLevel(p.Attainment), p.Param("preset"), p.rateText(),
		p.Replicas, "1×", round6(100*p.Tolerance), p.RateScale, p.MaxReplicas)
}

// rateText says what 1× is.
func (p *Plan) rateText() string {
	if p.Basis == BasisKnee {
		return fmt.Sprintf("1× = %.3g req/s, load %g on %d replicas (load 1: the rate at which they, balanced and caching nothing, reach the SLO's knee), not the %s's own arrival rate",
			p.Rate, p.Load, p.Replicas, p.Source)
	}
	return fmt.Sprintf("1× = %.3g req/s, the %s's own arrival rate", p.Rate, p.Source)
}

// Param is the value of p's parameter name, or "".
func (p *Plan) Param(name string) string {
	for _, q := range p.Params {
		if q.Name == name {
			return q.Value
		}
	}
	return ""
}

// planRows are the plan table of normalized p: a header and a row per
// policy.
func planRows(p *Plan) (head []string, rows [][]string) {
	head = []string{"policy", "capacity ×", fmt.Sprintf("replicas @%g×", p.RateScale), "saved vs rr", "binds"}
	for _, q := range p.Policies {
		capText := fmt.Sprintf("%.3g", q.Capacity)
		switch {
		case q.Capped:
			capText = "≥" + capText
		case q.Capacity == 0:
			capText = "0"
		}
		need := fmt.Sprint(q.Needed)
		if q.Needed == 0 {
			need = fmt.Sprintf(">%d", p.MaxReplicas)
		}
		saved := "-"
		if q.Saved != nil {
			saved = fmt.Sprintf("%+d", *q.Saved)
		}
		rows = append(rows, []string{q.Policy, capText, need, saved, or0(q.Binding, "-")})
	}
	return head, rows
}

package report

import (
	"fmt"
	"io"
	"slices"
)

// planPage is the plan page template's input.
type planPage struct {
	common
	Title    string
	Headline string
	Params   []Param
	Sections []capacitySection
	Data     [][2]attainData // per section: against traffic, against replicas
}

// WritePlanHTML writes plans, one per workload, as one self-contained
// HTML page: the verdict (the replicas kv-aware needs against
// round-robin's on the first workload) as its first line, then per
// workload its parameters, the plan table (as WritePlanTable's) and two
// charts of attainment (the share of requests meeting the SLO, 0..1),
// one curve per policy with the level as a horizontal line: against
// traffic on the given fleet, and against the replica count at the
// sized traffic. uPlot and the data are inlined; the page loads nothing
// from the network.
func WritePlanHTML(w io.Writer, ps []Plan) error {
	ns := make([]Plan, len(ps))
	for i := range ps {
		ns[i] = ps[i].normalized()
	}
	title := "kvrouter plan"
	if len(ns) == 1 {
		title = ns[0].Title
	}
	p := planPage{common: newCommon(), Title: title, Params: []Param{{"workloads", fmt.Sprint(len(ns))}}}
	if len(ns) > 0 {
		p.Headline = ns[0].Verdict("kv-aware")
	}
	for i := range ns {
		n := &ns[i]
		s := capacitySection{Index: i, Name: n.Param("workload"), Note: n.intro() + "; binds: what the requests past the capacity miss most."}
		for _, q := range n.Params {
			if !slices.Contains([]string{"load", "rate_scale", "arrival_rate", "replicas"}, q.Name) { // the search sets them
				s.Params = append(s.Params, q)
			}
		}
		s.Header, s.Rows = planRows(n)
		p.Sections = append(p.Sections, s)
		p.Data = append(p.Data, planCharts(n))
	}
	return render(w, "plan.html", &p)
}

// planCharts are normalized p's two attainment charts: against traffic,
// against replicas.
func planCharts(p *Plan) [2]attainData {
	levels := []float64{p.Attainment}
	load := attainData{Policies: []string{}, Curves: [][2][]float64{}, Levels: levels,
		XLabel: fmt.Sprintf("traffic on %d replicas (1 = %.3g req/s)", p.Replicas, p.Rate), XName: "traffic ×"}
	fl := attainData{Policies: []string{}, Curves: [][2][]float64{}, Levels: levels, Linear: true,
		XLabel: fmt.Sprintf("replicas at %g× the traffic", p.RateScale), XName: "replicas"}
	for _, q := range p.Policies {
		load.Policies, fl.Policies = append(load.Policies, q.Policy), append(fl.Policies, q.Policy)
		xy := [2][]float64{{}, {}}
		for _, a := range q.Load {
			xy[0], xy[1] = append(xy[0], a.Load), append(xy[1], a.Met)
		}
		load.Curves = append(load.Curves, xy)
		xy = [2][]float64{{}, {}}
		for _, a := range q.Fleet {
			xy[0], xy[1] = append(xy[0], float64(a.Replicas)), append(xy[1], a.Met)
		}
		fl.Curves = append(fl.Curves, xy)
	}
	load.Colors, fl.Colors = policyColors(load.Policies), policyColors(fl.Policies)
	return [2]attainData{load, fl}
}

// Verdict is one line on policy against round-robin: the replicas each
// needs for the sized traffic at the SLO, and their capacities on the
// given fleet; "" when either did not run.
func (p *Plan) Verdict(policy string) string {
	q, rr := p.policy(policy), p.policy(reference)
	if q == nil || rr == nil {
		return ""
	}
	need := func(q *PolicyPlan) string {
		if q.Needed == 0 {
			return fmt.Sprintf("more than %d", p.MaxReplicas)
		}
		return fmt.Sprint(q.Needed)
	}
	slo := p.SLO.orDefault()
	return fmt.Sprintf("At the SLO (TTFT ≤ %s, mean ITL ≤ %s for %s of requests), %s needs %s replicas for %g× this workload's traffic, round-robin %s; on %d replicas %s serves %.3g× it, round-robin %.3g×.",
		dur(Millis(slo.TTFT)), dur(Millis(slo.ITL)), pctLevel(p.Attainment), policy, need(q), p.RateScale, need(rr),
		p.Replicas, policy, round6(q.Capacity), round6(rr.Capacity))
}

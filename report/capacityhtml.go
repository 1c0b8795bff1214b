package report

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// capacityPage is the capacity page template's input.
type capacityPage struct {
	common
	Title    string
	Headline string
	Params   []Param
	Sections []capacitySection
	Data     []attainData // per section
}

// capacitySection is one workload's capacity: its parameters, the table
// (with ranks on the leaderboard) and the attainment chart drawn into
// #attain-Index.
type capacitySection struct {
	Index  int
	Name   string
	Note   string
	Params []Param
	Header []string
	Rows   [][]string
}

// attainData is what attainChart (charts.js) draws: per policy the share
// of requests meeting the SLO, 0..1, at every load its search ran, and
// the levels searched for as horizontal lines.
type attainData struct {
	Policies []string       `json:"policies"`
	Colors   []string       `json:"colors"` // per policy (policyColors)
	Curves   [][2][]float64 `json:"curves"` // per policy: loads, attainments 0..1
	Levels   []float64      `json:"levels"` // 0..1, highest first
	// XLabel and XName name the x axis and its values (empty: load);
	// Linear draws it on a linear scale instead of a log one.
	XLabel string `json:"xlabel,omitempty"`
	XName  string `json:"xname,omitempty"`
	Linear bool   `json:"linear,omitempty"`
}

// WriteCapacityHTML writes capacity searches, one per workload, as one
// self-contained HTML page: the verdict (which policy serves the most at
// the first level, by how much) as its first line, then per workload its
// parameters, the capacity table (as WriteCapacityTable's) and a chart of
// attainment (the share of requests meeting the SLO, 0..1) against load,
// one curve per policy, with each level drawn as a horizontal line.
// kv-aware is drawn in KVAwareColor. uPlot and the data are inlined; the
// page loads nothing from the network.
func WriteCapacityHTML(w io.Writer, cs []Capacity) error {
	ns := make([]Capacity, len(cs))
	for i := range cs {
		ns[i] = cs[i].normalized()
	}
	title := "kvrouter capacity"
	if len(ns) == 1 {
		title = ns[0].Title
	}
	p := capacityPage{common: newCommon(), Title: title, Headline: capacityHeadline(ns, "kv-aware"), Params: []Param{
		{"workloads", fmt.Sprint(len(ns))}, {"policies", fmt.Sprint(len(capacityPolicies(ns)))},
	}}
	if len(ns) > 0 {
		p.Params = append(p.Params, Param{"tolerance", fmt.Sprintf("%g%%", round6(100*ns[0].Tolerance))})
	}
	for i := range ns {
		p.Sections = append(p.Sections, newCapacitySection(i, &ns[i], nil))
		p.Data = append(p.Data, newAttainData(&ns[i]))
	}
	return render(w, "capacity.html", &p)
}

// newCapacitySection is normalized c's section; ranks (one standing per
// level) add a rank column per level when given.
func newCapacitySection(i int, c *Capacity, ranks []*Standing) capacitySection {
	slo := c.SLO.orDefault()
	s := capacitySection{Index: i, Name: c.workload(), Note: fmt.Sprintf(
		"SLO: TTFT ≤ %s and mean ITL ≤ %s. Capacity is the highest load (1 = %.3g req/s, a balanced fleet caching nothing at its knee) at which at least the level's share of the requests meets the SLO, on a grid of loads %g%% apart; ≥: still met at the highest load searched; × rr: as a multiple of round-robin's; binds: what the requests past the first level's capacity miss most.",
		dur(Millis(slo.TTFT)), dur(Millis(slo.ITL)), c.KneeRate, round6(100*c.Tolerance))}
	for _, p := range c.Params {
		if !slices.Contains([]string{"load", "rate_scale", "arrival_rate"}, p.Name) { // the search sets them
			s.Params = append(s.Params, p)
		}
	}
	s.Header, s.Rows = capacityRows(c, ranks)
	return s
}

// newAttainData is the attainment chart of normalized c.
func newAttainData(c *Capacity) attainData {
	d := attainData{Policies: []string{}, Curves: [][2][]float64{}, Levels: slices.Clone(c.Levels)}
	for _, p := range c.Policies {
		d.Policies = append(d.Policies, p.Policy)
		xy := [2][]float64{{}, {}}
		for _, a := range p.Curve {
			xy[0], xy[1] = append(xy[0], a.Load), append(xy[1], a.Met)
		}
		d.Curves = append(d.Curves, xy)
	}
	d.Colors = policyColors(d.Policies)
	if d.Levels == nil {
		d.Levels = []float64{}
	}
	return d
}

// workload is the workload c searched over: its "workload" parameter.
func (c *Capacity) workload() string {
	for _, p := range c.Params {
		if p.Name == "workload" {
			return p.Value
		}
	}
	return strings.TrimPrefix(c.Title, "kvrouter capacity: ")
}

// capacityPolicies are the policies of normalized searches cs, in the
// order they first ran.
func capacityPolicies(cs []Capacity) []string {
	var out []string
	for i := range cs {
		for _, p := range cs[i].Policies {
			if !slices.Contains(out, p.Policy) {
				out = append(out, p.Policy)
			}
		}
	}
	return out
}

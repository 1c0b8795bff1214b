package report

import (
	"embed"
	"fmt"
	"html/template"
	"io"
	"slices"
	"strings"
)

// assets holds uPlot 1.6.32 (MIT, vendored from `npm pack uplot@1.6.32`),
// the page templates and what they share: the style sheet and the charts.
//
//go:embed assets/uPlot.iife.min.js assets/uPlot.min.css assets/LICENSE page.html board.html capacity.html plan.html layout.html style.css charts.js
var assets embed.FS

// page is the run page template's input.
type page struct {
	common
	Title    string
	Headline string
	Params   []Param
	Header   []string
	Rows     [][]string
	Policy   int // rows before this index are policies, the rest oracles
	Hits     hitBars
	Reasons  []reasonBar
	Legend   []reasonSlice
	Data     chartData
}

// hitBars is the hit-rate card: one row per policy, the oracles as marks.
type hitBars struct {
	Rows    []hitRow
	Oracles []oracleMark
}

// hitRow is one policy's hit rate and prediction, in percent 0..100; Pred
// is negative when the policy predicts nothing.
type hitRow struct {
	Policy, Color      string
	Hit, Pred          float64
	HitText, PredText  string
	NoPrediction, Bold bool
}

// oracleMark is an oracle's hit rate, in percent, and its line's style.
type oracleMark struct {
	Name  string
	Pct   float64
	Text  string
	Class string
}

// newHitBars returns the hit-rate card of a normalized run.
func newHitBars(r *Run) hitBars {
	var h hitBars
	colors := policyColors(names(r))
	for i, p := range r.Policies {
		row := hitRow{Policy: p.Policy, Color: colors[i], Hit: pct100(p.HitRate), Pred: pct100(p.PredictedHitRate),
			HitText: pct(p.HitRate), PredText: "pred " + pct(p.PredictedHitRate), NoPrediction: p.NoPrediction,
			Bold: colors[i] == KVAwareColor}
		if p.NoPrediction {
			row.Pred, row.PredText = -1, "no prediction"
		}
		h.Rows = append(h.Rows, row)
	}
	for i, o := range r.Oracles {
		class := "o1"
		if i == 0 {
			class = "o0"
		}
		h.Oracles = append(h.Oracles, oracleMark{Name: o.Name, Pct: pct100(o.HitRate), Text: pct(o.HitRate), Class: class})
	}
	return h
}

// pct100 is a fraction as a percentage clamped to 0..100, for a width.
func pct100(f float64) float64 { return round6(100 * min(max(f, 0), 1)) }

// names returns the run's policy names in order.
func names(r *Run) []string {
	out := make([]string, len(r.Policies))
	for i, p := range r.Policies {
		out[i] = p.Policy
	}
	return out
}

// common is what every page inlines: uPlot and its style sheet, our style
// sheet and our charts.
type common struct {
	UPlot  template.JS
	CSS    template.CSS
	Style  template.CSS
	Charts template.JS
}

// newCommon returns the inlined assets.
func newCommon() common {
	lic := asset("assets/LICENSE")
	return common{
		UPlot:  template.JS("/*! uPlot 1.6.32 | " + strings.ReplaceAll(lic, "*/", "* /") + "*/\n" + asset("assets/uPlot.iife.min.js")),
		CSS:    template.CSS(asset("assets/uPlot.min.css")),
		Style:  template.CSS(asset("style.css")),
		Charts: template.JS(asset("charts.js")),
	}
}

// asset returns an embedded file; go:embed fails the build without it.
func asset(name string) string {
	b, _ := assets.ReadFile(name)
	return string(b)
}

// render executes the page template file, with layout.html, on data.
func render(w io.Writer, file string, data any) error {
	tpl, err := template.ParseFS(assets, file, "layout.html")
	if err != nil {
		return fmt.Errorf("report html: %w", err)
	}
	if err := tpl.Execute(w, data); err != nil {
		return fmt.Errorf("report html: %w", err)
	}
	return nil
}

// chartData is what the page's script draws with uPlot.
type chartData struct {
	Policies []string       `json:"policies"`
	Colors   []string       `json:"colors"`  // per policy (policyColors)
	Palette  []string       `json:"palette"` // for replicas
	CDF      [][2][]float64 `json:"cdf"`     // per policy: xs (ms), ys (fraction)
	Oracles  []Oracle       `json:"oracles"`
	Load     []loadChart    `json:"load"`
}

// loadChart is one policy's per-replica load over time.
type loadChart struct {
	Bucket  float64     `json:"bucket_s"`
	Replica [][]float64 `json:"replica"`
}

// reasonBar is one policy's decision reasons as a stacked bar.
type reasonBar struct {
	Policy string
	Slices []reasonSlice
}

// reasonSlice is one reason's share of a bar.
type reasonSlice struct {
	Reason string
	Count  int
	Pct    float64
	Color  string
}

// WriteHTML writes run as one self-contained HTML page: a header with the
// run's parameters, the verdict (Headline) as its first line, the table,
// and charts (TTFT CDF per policy, hit rate against the oracles,
// per-replica load over time, decision reasons). kv-aware is always drawn
// in KVAwareColor. uPlot and the data are inlined; the page loads nothing
// from the network.
func WriteHTML(w io.Writer, run *Run) error {
	r := run.normalized()
	header, rows := dropBlank(tableHeader(), tableRows(&r, ""))
	p := page{
		common:   newCommon(),
		Title:    r.Title,
		Headline: headline(&r),
		Params:   r.Params,
		Header:   header,
		Rows:     rows,
		Policy:   len(r.Policies),
		Hits:     newHitBars(&r),
		Data:     charts(&r),
	}
	p.Reasons, p.Legend = reasons(&r)
	return render(w, "page.html", &p)
}

// dropBlank returns the table without the columns blank in every row
// (pred when no policy predicts, %pooled without the pooled oracle), so
// that the rest fits a narrower window.
func dropBlank(header []string, rows [][]string) ([]string, [][]string) {
	keep := make([]bool, len(header))
	for j := range header {
		keep[j] = j == 0
		for _, row := range rows {
			keep[j] = keep[j] || j < len(row) && row[j] != ""
		}
	}
	pick := func(cells []string) []string {
		var out []string
		for j, c := range cells {
			if j < len(keep) && keep[j] {
				out = append(out, c)
			}
		}
		return out
	}
	out := make([][]string, len(rows))
	for i, row := range rows {
		out[i] = pick(row)
	}
	return pick(header), out
}

// charts gathers the chart series of a normalized run.
func charts(r *Run) chartData {
	d := chartData{Oracles: r.Oracles, CDF: [][2][]float64{}, Load: []loadChart{},
		Policies: []string{}, Colors: policyColors(names(r)), Palette: policyPalette[:]}
	for _, p := range r.Policies {
		d.Policies = append(d.Policies, p.Policy)
		var xy [2][]float64
		xy[0], xy[1] = []float64{}, []float64{}
		for _, pt := range p.Series.TTFT {
			xy[0] = append(xy[0], pt.X)
			xy[1] = append(xy[1], pt.Y)
		}
		d.CDF = append(d.CDF, xy)
		lc := loadChart{Bucket: round6(p.Series.Bucket.Seconds()), Replica: p.Series.Load}
		if lc.Replica == nil {
			lc.Replica = [][]float64{}
		}
		d.Load = append(d.Load, lc)
	}
	return d
}

// reasons returns the stacked reason bars, one per policy, and the legend;
// reasons are coloured in sorted order, so colours agree across policies.
func reasons(r *Run) ([]reasonBar, []reasonSlice) {
	var names []string
	for _, p := range r.Policies {
		for k := range p.Reasons {
			if !slices.Contains(names, k) {
				names = append(names, k)
			}
		}
	}
	slices.Sort(names)
	var legend []reasonSlice
	for i, n := range names {
		legend = append(legend, reasonSlice{Reason: n, Color: palette(i)})
	}
	var bars []reasonBar
	for _, p := range r.Policies {
		total := 0
		for _, c := range p.Reasons {
			total += c
		}
		b := reasonBar{Policy: p.Policy}
		for i, n := range names {
			if c := p.Reasons[n]; c > 0 {
				b.Slices = append(b.Slices, reasonSlice{Reason: n, Count: c, Pct: round6(100 * float64(c) / float64(total)), Color: palette(i)})
			}
		}
		bars = append(bars, b)
	}
	return bars, legend
}

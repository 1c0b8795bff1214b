package report

import "strings"

// KVAwareColor is kv-aware's colour in every chart: a strong red that no
// other policy is given. kv-aware-precise (and any other "kv-aware-"
// variant) takes KVAwarePreciseColor, a darker red.
const (
	KVAwareColor        = "#d62728"
	KVAwarePreciseColor = "#7f1d1d"
)

// policyPalette colours the other policies, in run order: 16 hues told
// apart on a white page (after Tableau 10 and its darker companions),
// none of them red, so that kv-aware stands out however many policies
// run. More than 16 other policies repeat it.
var policyPalette = [...]string{
	"#1f77b4", // blue
	"#2ca02c", // green
	"#ff7f0e", // orange
	"#9467bd", // purple
	"#8c564b", // brown
	"#e377c2", // pink
	"#7f7f7f", // grey
	"#bcbd22", // olive
	"#17becf", // cyan
	"#393b79", // indigo
	"#637939", // moss
	"#8c6d31", // ochre
	"#7b4173", // plum
	"#6b6ecf", // periwinkle
	"#b5cf6b", // lime
	"#000000", // black
}

// policyColors returns a colour per policy name: KVAwareColor for
// kv-aware, KVAwarePreciseColor for its variants, and the palette in
// order for the others, so a run's colours depend only on its order of
// policies.
func policyColors(names []string) []string {
	out := make([]string, len(names))
	k := 0
	for i, n := range names {
		switch {
		case n == "kv-aware":
			out[i] = KVAwareColor
		case strings.HasPrefix(n, "kv-aware"):
			out[i] = KVAwarePreciseColor
		default:
			out[i] = policyPalette[k%len(policyPalette)]
			k++
		}
	}
	return out
}

// reasonPalette colours decision reasons: the policy palette, then the
// light companions of its first eight hues (24 in all; the policies of
// route give 17 reasons).
var reasonPalette = [...]string{
	"#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
	"#17becf", "#393b79", "#637939", "#8c6d31", "#7b4173", "#6b6ecf", "#b5cf6b", "#000000",
	"#aec7e8", "#98df8a", "#ffbb78", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7", "#dbdb8d",
}

// palette colours reasons, in order.
func palette(i int) string { return reasonPalette[i%len(reasonPalette)] }

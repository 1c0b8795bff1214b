package report

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"
)

// tableHeader returns the table's header, one cell per column.
func tableHeader() []string {
	return []string{
		"policy", "ttft p50", "p90", "p99", "mean", "e2e p50", "p99", "itl p50", "p99",
		"hit", "pred", "%pooled", "prefill", "goodput", "slo", "done", "rej", "err", "load max/mean",
	}
}

// hitColumn is the index of the hit-rate column.
const hitColumn = 9

// tableRows returns the table's rows for a normalized run: one per policy,
// then one per oracle (hit rate only, blank elsewhere). blank fills a
// cell with no figure: "-" in a terminal, "" in HTML.
func tableRows(r *Run, blank string) [][]string {
	var rows [][]string
	for _, p := range r.Policies {
		pred := pct(p.PredictedHitRate)
		if p.NoPrediction {
			pred = blank
		}
		pooled := pooledCell(p.PooledPct, len(r.Oracles))
		if pooled == "-" {
			pooled = blank
		}
		rows = append(rows, []string{p.Policy,
			dur(p.TTFT.P50), dur(p.TTFT.P90), dur(p.TTFT.P99), dur(p.TTFT.Mean),
			dur(p.E2E.P50), dur(p.E2E.P99), dur(p.ITL.P50), dur(p.ITL.P99),
			pct(p.HitRate), pred, pooled,
			tokens(p.PrefillTokens), fmt.Sprintf("%.2f/s", p.Goodput), pct(p.SLOMet),
			fmt.Sprint(p.Completed), fmt.Sprint(p.Rejected), fmt.Sprint(p.Errors),
			fmt.Sprintf("%.1f/%.1f", p.MaxLoad, p.MeanLoad)})
	}
	for _, o := range r.Oracles {
		cells := make([]string, len(tableHeader()))
		for i := range cells {
			cells[i] = blank
		}
		cells[0], cells[hitColumn] = "oracle "+o.Name, pct(o.HitRate)
		rows = append(rows, cells)
	}
	return rows
}

// WriteTable writes run as an aligned table: one row per policy, then one
// row per oracle (hit rate only), under a line with the goodput SLO when
// the run has one. Durations print as "850ms" or "1.24s", rates as
// percentages, prefill in tokens (k/M), goodput in requests/s.
func WriteTable(w io.Writer, run *Run) error {
	r := run.normalized()
	if r.SLO != nil {
		if _, err := fmt.Fprintln(w, sloLine(*r.SLO)); err != nil {
			return err
		}
	}
	if err := writeAligned(w, append([][]string{tableHeader()}, tableRows(&r, "-")...)); err != nil {
		return err
	}
	if rows := classRows(&r); rows != nil {
		if _, err := fmt.Fprintln(w); err != nil {
			return err
		}
		return writeAligned(w, rows)
	}
	return nil
}

// writeAligned writes rows as columns two spaces apart, each indented by
// two: figures aligned right, and names left: the first column and the
// columns left lists.
func writeAligned(w io.Writer, rows [][]string, left ...int) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	width := map[int]int{0: 0}
	for _, c := range left {
		width[c] = 0
	}
	for _, cells := range rows {
		for c := range width {
			if c < len(cells) {
				width[c] = max(width[c], utf8.RuneCountInString(cells[c]))
			}
		}
	}
	for _, cells := range rows {
		out := slices.Clone(cells)
		for c, n := range width {
			if c < len(out) {
				out[c] += strings.Repeat(" ", n-utf8.RuneCountInString(out[c])) // left-align names
			}
		}
		fmt.Fprint(tw, strings.Join(out, "\t")+"\t\n")
	}
	return tw.Flush()
}

// sloLine describes the goodput SLO in one line.
func sloLine(s SLO) string {
	return fmt.Sprintf("goodput SLO: TTFT ≤ %s, ITL ≤ %s", dur(Millis(s.TTFT)), dur(Millis(s.ITL)))
}

func pooledCell(p float64, oracles int) string {
	if oracles == 0 || p == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", p)
}

// dur formats a latency for the table.
func dur(m Millis) string {
	d := time.Duration(m)
	switch {
	case d == 0:
		return "0"
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.1fms", float64(d)/1e6)
	case d < time.Second:
		return fmt.Sprintf("%.0fms", float64(d)/1e6)
	case d < 100*time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
	return fmt.Sprintf("%.0fs", d.Seconds())
}

func pct(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

// tokens formats a token count: 950, 12.3k, 4.56M.
func tokens(n int64) string {
	switch {
	case n < 10_000:
		return fmt.Sprint(n)
	case n < 10_000_000:
		return fmt.Sprintf("%.1fk", float64(n)/1e3)
	}
	return fmt.Sprintf("%.2fM", float64(n)/1e6)
}

// WriteJSON writes run as one indented JSON object:
//
//	{"title": ..., "params": [{"name", "value"}], "slo": {"ttft_ms", "itl_ms"},
//	 "oracles": [{"name", "hit_rate"}],
//	 "policies": [{"policy", "requests", "completed", "rejected", "errors",
//	   "ttft_ms": {"p50", "p90", "p99", "mean"}, "e2e_ms": {...}, "itl_ms": {...},
//	   "hit_rate", "predicted_hit_rate", "pooled_pct", "prompt_tokens",
//	   "cached_tokens", "prefill_tokens", "output_tokens", "duration_ms",
//	   "throughput_tok_s", "goodput_req_s", "slo_met", "max_load",
//	   "mean_load", "peak_load", "reasons": {reason: count}, "per_replica": [n],
//	   "learned": [{"scale", "decode_scale", "horizon_ms", "tier_horizon_ms", "displaced", "hit_scale"}]}]}
//
// "slo" is there only when the run has one. The same run always gives the
// same bytes (see the package comment). The chart series are left out.
func WriteJSON(w io.Writer, run *Run) error {
	r := run.normalized()
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(&r); err != nil {
		return fmt.Errorf("report json: %w", err)
	}
	return nil
}

package demo

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kvrouter/kvrouter/report"
)

// Figures are one policy's headline numbers, from the engines' own
// reports.
type Figures struct {
	Policy string
	// TTFTp50 and TTFTp99, E2Ep50 and E2Ep99 (to the last token) are in
	// model time (client wall time / time scale).
	TTFTp50, TTFTp99, E2Ep50, E2Ep99 time.Duration
	// HitRate is Σ usage cached_tokens / Σ usage prompt_tokens, 0..1.
	HitRate float64
	// EngineHitRate is Σ vllm:prefix_cache_hits_total / Σ
	// vllm:prefix_cache_queries_total over the replicas, 0..1.
	EngineHitRate float64
	// Prefill is the prompt tokens computed: Σ prompt − Σ cached.
	Prefill int64
	// PerReplica counts completed requests per replica.
	PerReplica []int
	// Errors counts failed requests (rejections included).
	Errors int
	// Spread is how many distinct replicas served a conversation, on
	// average over conversations (1 = each stayed on one replica).
	Spread float64
}

// Figures returns the headline numbers of every policy, in order.
func (r *Result) Figures() []Figures {
	out := make([]Figures, len(r.Policies))
	for i, p := range r.Policies {
		tot := p.Load.Totals()
		out[i] = Figures{
			Policy: p.Policy, TTFTp50: p.Report.TTFT.P50.D(), TTFTp99: p.Report.TTFT.P99.D(),
			E2Ep50: p.Report.E2E.P50.D(), E2Ep99: p.Report.E2E.P99.D(),
			HitRate: tot.HitRate(), EngineHitRate: p.Engines.HitRate(), Prefill: tot.Prefill(),
			PerReplica: p.Report.PerReplica, Errors: tot.ErrorCount() + p.Load.Skipped, Spread: spread(&p),
		}
	}
	return out
}

// spread is the mean number of distinct replicas per session.
func spread(p *PolicyResult) float64 {
	seen := map[string]map[string]bool{}
	for _, s := range p.Load.Samples {
		if s.Session == "" || !s.OK() {
			continue
		}
		if seen[s.Session] == nil {
			seen[s.Session] = map[string]bool{}
		}
		seen[s.Session][s.Replica] = true
	}
	if len(seen) == 0 {
		return 0
	}
	n := 0
	for _, m := range seen {
		n += len(m)
	}
	return float64(n) / float64(len(seen))
}

// WriteTable writes the side-by-side table, one row per policy.
func (r *Result) WriteTable(w io.Writer) error {
	c := r.Config
	fmt.Fprintf(w, "%d replicas (%s, emulated), %d requests of %s per policy, each policy on a cold fleet.\n",
		c.Replicas, c.Preset, c.Requests, c.Workload)
	fmt.Fprintf(w, "Latencies are in MODEL time: wall time measured by the client divided by the time scale %g.\n", c.TimeScale)
	fmt.Fprintf(w, "hit = Σ usage.cached_tokens / Σ prompt_tokens from the responses; engine = the replicas' own\n")
	fmt.Fprintf(w, "vllm:prefix_cache_hits_total / queries_total scraped at the end; prefill = prompt − cached tokens.\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "policy\tttft p50\tttft p99\te2e p50\te2e p99\thit\tengine hit\tprefill tokens\treplicas/conv\trequests per replica\terrors\t")
	for _, f := range r.Figures() {
		per := make([]string, len(f.PerReplica))
		for i, n := range f.PerReplica {
			per[i] = fmt.Sprint(n)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.1f%%\t%.1f%%\t%d\t%.2f\t%s\t%d\t\n", f.Policy, ms(f.TTFTp50), ms(f.TTFTp99),
			ms(f.E2Ep50), ms(f.E2Ep99),
			100*f.HitRate, 100*f.EngineHitRate, f.Prefill, f.Spread, strings.Join(per, " "), f.Errors)
	}
	return tw.Flush()
}

// ms prints a duration in milliseconds, one decimal below 100 ms.
func ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	if v < 100 {
		return fmt.Sprintf("%.1fms", v)
	}
	return fmt.Sprintf("%.0fms", v)
}

// Run returns the demo as a report.Run (for report.WriteJSON and
// report.WriteHTML).
func (r *Result) Run() *report.Run {
	c := r.Config
	run := &report.Run{Title: "kvrouter demo", Params: []report.Param{
		{Name: "replicas", Value: fmt.Sprint(c.Replicas)},
		{Name: "preset", Value: c.Preset},
		{Name: "workload", Value: c.Workload},
		{Name: "requests per policy", Value: fmt.Sprint(c.Requests)},
		{Name: "time scale", Value: fmt.Sprintf("%g (latencies in model time)", c.TimeScale)},
		{Name: "seed", Value: fmt.Sprint(c.Seed)},
		{Name: "wall time", Value: r.Wall.Round(time.Millisecond).String()},
	}}
	for _, p := range r.Policies {
		run.Policies = append(run.Policies, p.Report)
	}
	return run
}

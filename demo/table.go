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
	// TTFTp50, TTFTp99 and TTFTMean, E2Ep50 and E2Ep99 (to the last
	// token) are the engines' own, on their model clocks, from a
	// request's arrival at its engine.
	TTFTp50, TTFTp99, TTFTMean, E2Ep50, E2Ep99 time.Duration
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
	// Kinds are the figures of each kind of traffic (Kind), in the order
	// chat, docs, agent, those the workload has.
	Kinds []Kind
}

// Figures returns the headline numbers of every policy, in order.
func (r *Result) Figures() []Figures {
	out := make([]Figures, len(r.Policies))
	for i, p := range r.Policies {
		tot := p.Load.Totals()
		out[i] = Figures{
			Policy: p.Policy, TTFTp50: p.Report.TTFT.P50.D(), TTFTp99: p.Report.TTFT.P99.D(), TTFTMean: p.Report.TTFT.Mean.D(),
			E2Ep50: p.Report.E2E.P50.D(), E2Ep99: p.Report.E2E.P99.D(),
			HitRate: tot.HitRate(), EngineHitRate: p.Engines.HitRate(), Prefill: tot.Prefill(),
			PerReplica: p.Report.PerReplica, Errors: tot.ErrorCount() + p.Load.Skipped, Spread: spread(&p),
			Kinds: kinds(&p),
		}
	}
	return out
}

// spread is the mean number of distinct replicas per conversation
// (sessions of kind chat; every session when the workload has no kinds).
func spread(p *PolicyResult) float64 {
	seen := map[string]map[string]bool{}
	chat := false
	for _, s := range p.Load.Samples {
		chat = chat || kindOf(s.Session) == "chat"
	}
	for _, s := range p.Load.Samples {
		if s.Session == "" || !s.OK() || chat && kindOf(s.Session) != "chat" {
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

// WriteTable writes the side-by-side tables: one row per policy, first
// the figures a busy host cannot move, then the latencies on the engines'
// clocks, then (for the demo's own workload) each kind of traffic.
func (r *Result) WriteTable(w io.Writer) error {
	c := r.Config
	fmt.Fprintf(w, "%d replicas (%s, emulated at %g× real time), %d requests of %s per policy, each policy on a cold fleet.\n",
		c.Replicas, c.Preset, 1/c.TimeScale, c.Requests, c.Workload)
	if r.Slowed.Samples > 0 {
		fmt.Fprintf(w, "The host was busy when the demo started (timers %v late at p99), so it runs at %g× real time instead of %g×.\n",
			r.Slowed.P99.Round(time.Millisecond), 1/c.TimeScale, 1/DefaultTimeScale)
	}
	fmt.Fprintf(w, "prefill = prompt tokens the engines computed; hit = Σ usage.cached_tokens / Σ prompt_tokens from the responses;\n")
	fmt.Fprintf(w, "engine = the replicas' own vllm:prefix_cache_hits_total / queries_total. Latencies are the engines' own, on their\n")
	fmt.Fprintf(w, "model clocks, from a request's arrival at its engine: a busy host does not stretch them.\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "policy\tprefill tokens\thit\tengine hit\trequests per replica\treplicas/conv\tttft mean\tttft p50\tttft p99\te2e p50\te2e p99\terrors\t")
	fs := r.Figures()
	for _, f := range fs {
		per := make([]string, len(f.PerReplica))
		for i, n := range f.PerReplica {
			per[i] = fmt.Sprint(n)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f%%\t%.1f%%\t%s\t%.2f\t%s\t%s\t%s\t%s\t%s\t%d\t\n", f.Policy, f.Prefill,
			100*f.HitRate, 100*f.EngineHitRate, strings.Join(per, " "), f.Spread,
			ms(f.TTFTMean), ms(f.TTFTp50), ms(f.TTFTp99), ms(f.E2Ep50), ms(f.E2Ep99), f.Errors)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(fs) == 0 || len(fs[0].Kinds) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nBy kind of traffic (prefill tokens, hit rate, mean TTFT; for the agent, the replicas its steps ran on):\n")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := []string{"policy"}
	for _, k := range fs[0].Kinds {
		head = append(head, k.Name+" ("+fmt.Sprint(k.Requests)+")")
	}
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	for _, f := range fs {
		row := []string{f.Policy}
		for _, k := range f.Kinds {
			cell := fmt.Sprintf("%d  %.0f%%  %s", k.Prefill, 100*k.HitRate, ms(k.TTFTMean))
			if k.Name == "agent" {
				cell += fmt.Sprintf("  on %d", k.Replicas)
			}
			row = append(row, cell)
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	return tw.Flush()
}

// ms prints a duration in milliseconds, one decimal below 100 ms, or in
// seconds from 10 s.
func ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	switch {
	case v < 100:
		return fmt.Sprintf("%.1fms", v)
	case v < 10000:
		return fmt.Sprintf("%.0fms", v)
	}
	return fmt.Sprintf("%.1fs", v/1000)
}

// Run returns the demo as a report.Run (for report.WriteJSON and
// report.WriteHTML), ranked as the terminal's verdict is: by mean TTFT on
// the engines' clocks.
func (r *Result) Run() *report.Run {
	c := r.Config
	run := &report.Run{Title: "kvrouter demo", Rank: Rank, Params: []report.Param{
		{Name: "replicas", Value: fmt.Sprint(c.Replicas)},
		{Name: "preset", Value: c.Preset},
		{Name: "workload", Value: c.Workload},
		{Name: "requests per policy", Value: fmt.Sprint(c.Requests)},
		{Name: "time scale", Value: fmt.Sprintf("%g (latencies on the engines' model clocks)", c.TimeScale)},
		{Name: "seed", Value: fmt.Sprint(c.Seed)},
		{Name: "host", Value: r.Host.String()},
		{Name: "wall time", Value: r.Wall.Round(time.Millisecond).String()},
	}}
	for _, p := range r.Policies {
		run.Policies = append(run.Policies, p.Report)
	}
	return run
}

// Rank is the metric the demo's verdict ranks the policies by, in the
// terminal and in the HTML report alike: mean time to first token on the
// engines' clocks, which counts every request's wait (a median would not
// see the requests queued behind a hot session).
const Rank = "ttft_mean"

// Verdict is the demo's verdict, the first line of the HTML report too
// (report.Headline of Run).
func (r *Result) Verdict() string { return report.Headline(r.Run()) }

// String describes the host's lateness in a line.
func (h HostLag) String() string {
	state := "quiet"
	if h.Busy() {
		state = "busy"
	}
	return fmt.Sprintf("%s: timers fired %v late at the median, %v at p99, %v at most (wall time)", state,
		h.P50.Round(10*time.Microsecond), h.P99.Round(10*time.Microsecond), h.Max.Round(10*time.Microsecond))
}

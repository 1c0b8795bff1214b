package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kvrouter/kvrouter/engine"
	"github.com/kvrouter/kvrouter/report"
	"github.com/kvrouter/kvrouter/sim"
	"github.com/kvrouter/kvrouter/trace"
)

// runSimArgs runs kvrouter sim with args and returns its stdout and
// stderr.
func runSimArgs(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	errf, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer errf.Close()
	var out bytes.Buffer
	err = simCommand(context.Background(), args, &out, errf)
	stderr, _ := os.ReadFile(errf.Name())
	return out.String(), string(stderr), err
}

// small is a small fleet and workload: a leaderboard of it runs in well
// under a second.
var small = []string{"--requests", "48", "--replicas", "2", "--policies", "kv-aware,round-robin,least-loaded"}

// boardJSON is the multi-cell JSON, as much of it as the tests read.
type boardJSON struct {
	Cells []struct {
		Params   []report.Param `json:"params"`
		SLO      map[string]float64
		Policies []struct {
			Policy    string  `json:"policy"`
			Completed int     `json:"completed"`
			HitRate   float64 `json:"hit_rate"`
			TTFT      struct {
				P99  float64 `json:"p99"`
				Mean float64 `json:"mean"`
			} `json:"ttft_ms"`
			E2E struct {
				P99 float64 `json:"p99"`
			} `json:"e2e_ms"`
		} `json:"policies"`
	} `json:"cells"`
	Summary struct {
		Default string `json:"default"`
		Cells   []struct {
			Workload string  `json:"workload"`
			Load     float64 `json:"load"`
			Metrics  map[string]struct {
				Winner string             `json:"winner"`
				Tied   []string           `json:"tied"`
				Best   float64            `json:"best"`
				Ranks  map[string]int     `json:"ranks"`
				Ratios map[string]float64 `json:"ratios"`
			} `json:"metrics"`
			DefaultWithin map[string]bool `json:"default_within_tolerance"`
		} `json:"cells"`
		Wins map[string]map[string]int `json:"wins"`
	} `json:"summary"`
}

// TestSimBoard runs a leaderboard of 2 workloads × 2 loads × 3 policies
// and checks the summary against the figures of the cells: every rank
// orders the figures, the winner is the first best, ratios divide by it,
// wins count rank-1 cells.
func TestSimBoard(t *testing.T) {
	out, _, err := runSimArgs(t, append([]string{"--workload", "shared-prefix,multi-turn-chat", "--load", "0.5,0.9", "--json"}, small...)...)
	if err != nil {
		t.Fatal(err)
	}
	var b boardJSON
	if err := json.Unmarshal([]byte(out), &b); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if len(b.Cells) != 4 || len(b.Summary.Cells) != 4 {
		t.Fatalf("got %d cells and %d summaries, want 4", len(b.Cells), len(b.Summary.Cells))
	}
	if b.Summary.Default != "kv-aware" {
		t.Errorf("default %q, want kv-aware", b.Summary.Default)
	}
	wins := map[string]map[string]int{}
	for i, c := range b.Cells {
		cs := b.Summary.Cells[i]
		wantW, wantL := []string{"shared-prefix", "multi-turn-chat"}[i/2], []float64{0.5, 0.9}[i%2]
		if cs.Workload != wantW || cs.Load != wantL || param(c.Params, "workload") != wantW {
			t.Errorf("cell %d is %s @ %g, want %s @ %g", i, cs.Workload, cs.Load, wantW, wantL)
		}
		if c.SLO["ttft_ms"] <= 0 || c.SLO["itl_ms"] <= 0 {
			t.Errorf("cell %d: SLO %v, want both bounds", i, c.SLO)
		}
		if len(c.Policies) != 3 {
			t.Fatalf("cell %d: %d policies, want 3", i, len(c.Policies))
		}
		figures := map[string]map[string]float64{"ttft_p99": {}, "ttft_mean": {}, "e2e_p99": {}, "hit_rate": {}}
		var order []string
		for _, p := range c.Policies {
			order = append(order, p.Policy)
			figures["ttft_p99"][p.Policy], figures["ttft_mean"][p.Policy] = p.TTFT.P99, p.TTFT.Mean
			figures["e2e_p99"][p.Policy], figures["hit_rate"][p.Policy] = p.E2E.P99, p.HitRate
		}
		for m, fig := range figures {
			st := cs.Metrics[m]
			better := func(a, b float64) bool { return a < b }
			if m == "hit_rate" {
				better = func(a, b float64) bool { return a > b }
			}
			best := order[0]
			for _, p := range order {
				if better(fig[p], fig[best]) {
					best = p
				}
			}
			if st.Winner != best || st.Best != fig[best] {
				t.Errorf("cell %d %s: winner %s (%g), want the first best %s (%g)", i, m, st.Winner, st.Best, best, fig[best])
			}
			for _, p := range order {
				for _, q := range order {
					if better(fig[p], fig[q]) != (st.Ranks[p] < st.Ranks[q]) {
						t.Errorf("cell %d %s: %s %g rank %d, %s %g rank %d", i, m, p, fig[p], st.Ranks[p], q, fig[q], st.Ranks[q])
					}
				}
				if want := fig[p] / fig[best]; math.Abs(st.Ratios[p]-want) > 1e-6 {
					t.Errorf("cell %d %s: %s ratio %g, want %g", i, m, p, st.Ratios[p], want)
				}
				if st.Ranks[p] == 1 {
					if wins[m] == nil {
						wins[m] = map[string]int{}
					}
					wins[m][p]++
				}
			}
			if got, want := cs.DefaultWithin[m], math.Abs(st.Ratios["kv-aware"]-1) <= 0.03+1e-9; got != want {
				t.Errorf("cell %d %s: kv-aware within 3%%: %v, want %v (ratio %g)", i, m, got, want, st.Ratios["kv-aware"])
			}
		}
	}
	for m, w := range wins {
		for p, n := range w {
			if b.Summary.Wins[m][p] != n {
				t.Errorf("%s: %s wins %d cells, want %d", m, p, b.Summary.Wins[m][p], n)
			}
		}
	}
}

func param(ps []report.Param, name string) string {
	for _, p := range ps {
		if p.Name == name {
			return p.Value
		}
	}
	return ""
}

// TestSimOneCell: one (workload, load) keeps the one-run JSON object, byte
// for byte what sim.Run gives, and today's table.
func TestSimOneCell(t *testing.T) {
	out, _, err := runSimArgs(t, append([]string{"--workload", "shared-prefix", "--load", "0.7", "--json"}, small...)...)
	if err != nil {
		t.Fatal(err)
	}
	w, err := trace.Generate("shared-prefix", trace.GenOptions{Seed: 1, Requests: 48})
	if err != nil {
		t.Fatal(err)
	}
	preset, _ := engine.Preset("llama3-8b-h100")
	run, err := sim.Run(sim.Config{Workload: w.Name, Requests: w.Requests, Replicas: 2, PresetName: "llama3-8b-h100", Preset: preset,
		Load: 0.7, Policies: []string{"kv-aware", "round-robin", "least-loaded"}, Seed: 1, KVEventDelay: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	if err := report.WriteJSON(&want, &run); err != nil {
		t.Fatal(err)
	}
	if out != want.String() {
		t.Errorf("one cell's JSON differs from sim.Run's:\n%s\nwant:\n%s", out, want.String())
	}
	out, _, err = runSimArgs(t, append([]string{"--workload", "shared-prefix"}, small...)...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out, "goodput SLO: ") || strings.Contains(out, "== summary") {
		t.Errorf("one cell's table: got\n%s\nwant the SLO line and the run table, no summary", out)
	}
}

// TestSimBoardTable: the leaderboard's table has a section per cell and
// the summary, in 120 columns; --report writes the page.
func TestSimBoardTable(t *testing.T) {
	html := filepath.Join(t.TempDir(), "board.html")
	out, _, err := runSimArgs(t, append([]string{"--workload", "unique,hot-prefix", "--load", "0.6", "--report", html}, small...)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"== unique @ 0.6 ·", "== hot-prefix @ 0.6 ·", "== summary over 2 cells", "kv-aware within 3% of the best"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if n := utf8.RuneCountInString(l); n > 120 {
			t.Errorf("line is %d columns, want ≤ 120: %q", n, l)
		}
	}
	page, err := os.ReadFile(html)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(page, []byte(`id="cell-1"`)) {
		t.Error("the report has no section for the second cell")
	}
}

// TestSimMissingTraces: with --workload all and no trace directory, the
// trace workloads are skipped with a note each and the others run; named,
// a missing trace is an error.
func TestSimMissingTraces(t *testing.T) {
	t.Chdir(t.TempDir()) // no go.mod above, no ../shared/traces
	out, stderr, err := runSimArgs(t, "--workload", "all", "--requests", "16", "--replicas", "2", "--policies", "round-robin", "--json")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"mooncake-conversation", "azure-conv", "azure-code"} {
		if !strings.Contains(stderr, "kvrouter sim: skipping workload "+name+": trace file ") {
			t.Errorf("stderr lacks a note for %s:\n%s", name, stderr)
		}
	}
	if n := strings.Count(stderr, "\n"); n != 3 {
		t.Errorf("stderr has %d lines, want one per skipped workload:\n%s", n, stderr)
	}
	var b boardJSON
	if err := json.Unmarshal([]byte(out), &b); err != nil {
		t.Fatal(err)
	}
	if want := len(trace.Names()) - 3; len(b.Cells) != want {
		t.Errorf("got %d cells, want %d (every generated workload)", len(b.Cells), want)
	}
	if _, _, err := runSimArgs(t, "--workload", "unique,azure-conv", "--requests", "16"); err == nil || !strings.Contains(err.Error(), "azure-conv") {
		t.Errorf("a named missing trace: error %v, want one naming it", err)
	}
	// Named, the Mooncake trace's error says where the public trace lives
	// and how to pass it.
	_, _, err = runSimArgs(t, "--workload", "mooncake-conversation")
	for _, want := range []string{"kvcache-ai/Mooncake", "FAST25-release/traces/", "conversation_trace.jsonl",
		"https://raw.githubusercontent.com/kvcache-ai/Mooncake/main/FAST25-release/traces/conversation_trace.jsonl",
		"--trace conversation_trace.jsonl"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("mooncake-conversation without its trace: error %v, want it to contain %q", err, want)
		}
	}
}

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// capacityJSON is one capacity search as --capacity --json writes it, as
// much of it as the tests read.
type capacityJSON struct {
	Title    string `json:"title"`
	Levels   []float64
	Policies []struct {
		Policy string `json:"policy"`
		At     []struct {
			Level float64 `json:"level"`
			Load  float64 `json:"load"`
		} `json:"at"`
		Curve []struct {
			Load float64 `json:"load"`
			Met  float64 `json:"met"`
		} `json:"curve"`
	} `json:"policies"`
}

// boardCapacityJSON is the capacity part of a leaderboard's JSON.
type boardCapacityJSON struct {
	Cells    []json.RawMessage `json:"cells"`
	Capacity []capacityJSON    `json:"capacity"`
	Summary  struct {
		Capacity struct {
			Levels    []float64 `json:"levels"`
			Policies  []string  `json:"policies"`
			Workloads []struct {
				Workload string `json:"workload"`
				Levels   []struct {
					Winner string             `json:"winner"`
					Best   float64            `json:"best"`
					Ranks  map[string]int     `json:"ranks"`
					Ratios map[string]float64 `json:"ratios"`
				} `json:"levels"`
				DefaultWithin []bool `json:"default_within_tolerance"`
			} `json:"workloads"`
			Wins []map[string]int `json:"wins"`
		} `json:"capacity"`
	} `json:"summary"`
}

// TestSimBoardCapacity runs a leaderboard of 2 workloads × 2 loads with
// --capacity: the board holds one capacity search per workload (not per
// cell), the same search --capacity alone gives, and its summary ranks
// the policies by their capacity at each level, counts the workloads each
// wins and judges kv-aware within 3% of the best.
func TestSimBoardCapacity(t *testing.T) {
	workloads := []string{"shared-prefix", "multi-turn-chat"}
	out, _, err := runSimArgs(t, append([]string{"--capacity", "--workload", strings.Join(workloads, ","), "--load", "0.5,0.9", "--json"}, small...)...)
	if err != nil {
		t.Fatal(err)
	}
	var b boardCapacityJSON
	if err := json.Unmarshal([]byte(out), &b); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	s := b.Summary.Capacity
	if len(b.Cells) != 4 || len(b.Capacity) != 2 || len(s.Workloads) != 2 {
		t.Fatalf("%d cells, %d capacity searches, %d capacity standings; want 4, 2 (one per workload), 2", len(b.Cells), len(b.Capacity), len(s.Workloads))
	}
	alone, _, err := runSimArgs(t, append([]string{"--capacity", "--workload", workloads[1], "--json"}, small...)...)
	if err != nil {
		t.Fatal(err)
	}
	var one capacityJSON
	if err := json.Unmarshal([]byte(alone), &one); err != nil {
		t.Fatal(err)
	}
	if got, _ := json.Marshal(b.Capacity[1]); string(got) != string(mustJSON(t, one)) {
		t.Errorf("the board's search of %s differs from --capacity alone's:\n%s\n%s", workloads[1], got, mustJSON(t, one))
	}
	wins := make([]map[string]int, len(s.Levels))
	for i, c := range b.Capacity {
		ws := s.Workloads[i]
		if ws.Workload != workloads[i] || c.Title != "kvrouter capacity: "+workloads[i] {
			t.Errorf("search %d is %s (%s), want %s", i, ws.Workload, c.Title, workloads[i])
		}
		for k := range s.Levels {
			st, load := ws.Levels[k], map[string]float64{}
			best := c.Policies[0].Policy
			for _, p := range c.Policies {
				load[p.Policy] = p.At[k].Load
				if p.At[k].Load > load[best] {
					best = p.Policy
				}
			}
			if st.Winner != best || st.Best != load[best] {
				t.Errorf("%s at %g: winner %s (%g), want the first highest %s (%g)", ws.Workload, s.Levels[k], st.Winner, st.Best, best, load[best])
			}
			for p, lp := range load {
				for q, lq := range load {
					if (lp > lq) != (st.Ranks[p] < st.Ranks[q]) {
						t.Errorf("%s at %g: %s %g rank %d, %s %g rank %d", ws.Workload, s.Levels[k], p, lp, st.Ranks[p], q, lq, st.Ranks[q])
					}
				}
				if st.Ranks[p] == 1 {
					if wins[k] == nil {
						wins[k] = map[string]int{}
					}
					wins[k][p]++
				}
			}
			if got, want := ws.DefaultWithin[k], load["kv-aware"] >= 0.97*load[best]-1e-9; got != want {
				t.Errorf("%s at %g: kv-aware within 3%%: %v, want %v (%g of %g)", ws.Workload, s.Levels[k], got, want, load["kv-aware"], load[best])
			}
		}
	}
	for k, w := range wins {
		for p, n := range w {
			if s.Wins[k][p] != n {
				t.Errorf("level %g: %s wins %d workloads, want %d", s.Levels[k], p, s.Wins[k][p], n)
			}
		}
	}
}

// mustJSON is v as JSON.
func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestSimCapacityModes: --capacity alone, with several workloads, or with
// one --load, stays the capacity-only mode (a search per workload, no
// cells); --report writes the capacity page, and with a leaderboard the
// board's page with its capacity sections; the table of the board has its
// capacity tables.
func TestSimCapacityModes(t *testing.T) {
	dir := t.TempDir()
	page := filepath.Join(dir, "capacity.html")
	out, _, err := runSimArgs(t, append([]string{"--capacity", "--workload", "shared-prefix,multi-turn-chat", "--json", "--report", page}, small...)...)
	if err != nil {
		t.Fatal(err)
	}
	var many []capacityJSON
	if err := json.Unmarshal([]byte(out), &many); err != nil || len(many) != 2 || len(many[0].Policies[0].Curve) == 0 {
		t.Errorf("--capacity over two workloads: %v, %d searches; want an array of 2 with their curves:\n%s", err, len(many), out)
	}
	html, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<title>kvrouter capacity</title>", `id="attain-1"`, "function attainChart"} {
		if !strings.Contains(string(html), want) {
			t.Errorf("--capacity --report: the page lacks %q", want)
		}
	}
	out, _, err = runSimArgs(t, append([]string{"--capacity", "--load", "0.8", "--json"}, small...)...)
	var one capacityJSON
	if err != nil || json.Unmarshal([]byte(out), &one) != nil || one.Title != "kvrouter capacity: shared-prefix" {
		t.Errorf("--capacity --load 0.8: %v, want one search:\n%s", err, out)
	}
	board := filepath.Join(dir, "board.html")
	out, _, err = runSimArgs(t, append([]string{"--capacity", "--load", "0.5,0.9", "--report", board}, small...)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"== shared-prefix @ 0.9 ·", "== shared-prefix · capacity at the SLO", "\ncapacity 99% (load; higher is better)\n", "workloads won on capacity, of 1"} {
		if !strings.Contains(out, want) {
			t.Errorf("board table lacks %q:\n%s", want, out)
		}
	}
	html, err = os.ReadFile(board)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<title>kvrouter leaderboard</title>", `id="cdf-1"`, `id="capacity-0"`, `id="attain-0"`, "Capacity at 99%:"} {
		if !strings.Contains(string(html), want) {
			t.Errorf("board --report: the page lacks %q", want)
		}
	}
}

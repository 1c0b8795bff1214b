package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/report"
)

// splitRows is a one-cell run's JSON, as much as TestSimSplits reads.
type splitRows struct {
	Params   []report.Param `json:"params"`
	Policies []struct {
		Policy    string  `json:"policy"`
		Completed int     `json:"completed"`
		Goodput   float64 `json:"goodput_req_s"`
	} `json:"policies"`
}

// simSplit runs one cell of 4 replicas with args and returns its rows.
func simSplit(t *testing.T, args ...string) splitRows {
	t.Helper()
	out, stderr, err := runSimArgs(t, append([]string{"--workload", "shared-prefix", "--load", "0.8", "--replicas", "4", "--requests", "80", "--json"}, args...)...)
	if err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	var r splitRows
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return r
}

// TestSimSplits: --prefill-replicas 0,2 runs the aggregated fleet and its
// split into 2 prefill and 2 decode replicas as one report, at the same
// arrival rate: each split's rows are those of a run of that split
// alone, named for it, and the P/D peer runs only on the split.
func TestSimSplits(t *testing.T) {
	both := simSplit(t, "--prefill-replicas", "0,2", "--policies", "kv-aware,dynamo-pd")
	var names []string
	for _, p := range both.Policies {
		names = append(names, p.Policy)
	}
	checkSplitRows(t, names, both.Params)
	alone := map[string]splitRows{
		"0": simSplit(t, "--policies", "kv-aware"),
		"2": simSplit(t, "--prefill-replicas", "2", "--policies", "kv-aware,dynamo-pd"),
	}
	want := append(alone["0"].Policies, alone["2"].Policies...)
	for i, p := range both.Policies {
		w := want[i]
		if !strings.HasPrefix(p.Policy, w.Policy) || p.Completed == 0 || p.Completed != w.Completed || p.Goodput != w.Goodput {
			t.Errorf("row %d %+v, want the run alone's %+v", i, p, w)
		}
	}
}

// checkSplitRows fails t unless a report of the splits 0,2 of kv-aware
// and dynamo-pd has the rows names and says its splits in params.
func checkSplitRows(t *testing.T, names []string, params []report.Param) {
	t.Helper()
	if want := []string{"kv-aware", "kv-aware 2p+2d", "dynamo-pd 2p+2d"}; !slices.Equal(names, want) {
		t.Fatalf("rows %v, want %v", names, want)
	}
	if i := slices.IndexFunc(params, func(p report.Param) bool { return p.Name == "prefill_replicas" }); i < 0 || params[i].Value != "0,2" {
		t.Errorf("params %v, want prefill_replicas 0,2", params)
	}
}

// TestSimCapacitySplits: --capacity --prefill-replicas 0,2 searches the
// capacity of the aggregated fleet and of its split as one result, each
// row what a search of that split alone finds, named for its split.
func TestSimCapacitySplits(t *testing.T) {
	both := capacityRows(t, "--prefill-replicas", "0,2", "--policies", "kv-aware,dynamo-pd")
	var names []string
	for _, p := range both.Policies {
		names = append(names, p.Policy)
	}
	checkSplitRows(t, names, both.Params)
	want := append(capacityRows(t, "--policies", "kv-aware").Policies,
		capacityRows(t, "--prefill-replicas", "2", "--policies", "kv-aware,dynamo-pd").Policies...)
	for i, p := range both.Policies {
		w := want[i]
		if !strings.HasPrefix(p.Policy, w.Policy) || len(p.At) == 0 || p.At[0].Load <= 0 || !slices.Equal(p.At, w.At) {
			t.Errorf("row %d %+v, want the search alone's %+v", i, p, w)
		}
	}
}

// capacityRows runs a capacity search on one cell of 4 replicas with args
// and returns its JSON.
func capacityRows(t *testing.T, args ...string) report.Capacity {
	t.Helper()
	out, stderr, err := runSimArgs(t, append([]string{"--capacity", "--workload", "shared-prefix", "--replicas", "4", "--requests", "80", "--tolerance", "0.1", "--json"}, args...)...)
	if err != nil {
		t.Fatalf("%v: %s", err, stderr)
	}
	var c report.Capacity
	if err := json.Unmarshal([]byte(out), &c); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return c
}

// TestSimSplitsRefused: a split must leave a decode replica, and a
// leaderboard's capacity column searches one split.
func TestSimSplitsRefused(t *testing.T) {
	for _, args := range [][]string{
		{"--prefill-replicas", "0,4"},
		{"--prefill-replicas", "x"},
		{"--prefill-replicas", "0,2", "--capacity", "--load", "0.5,0.8"},
	} {
		_, _, err := runSimArgs(t, append([]string{"--workload", "shared-prefix", "--replicas", "4", "--requests", "20"}, args...)...)
		if err == nil || !strings.Contains(err.Error(), "prefill-replicas") {
			t.Errorf("%v: error %v, want one naming --prefill-replicas", args, err)
		}
	}
}

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestResultsFileHasEverySection: docs/results.md has the markers of
// every section the generator writes, once each, so that a run replaces
// them in place.
func TestResultsFileHasEverySection(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "results.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	for _, s := range sections() {
		for _, m := range []string{"<!-- results:" + s.name + " -->\n", "<!-- /results:" + s.name + " -->"} {
			if n := strings.Count(text, m); n != 1 {
				t.Errorf("docs/results.md has %q %d times, want once", m, n)
			}
		}
	}
}

func TestReplaceSection(t *testing.T) {
	text := "# R\n\n<!-- results:a -->\nold\n<!-- /results:a -->\n\ntail\n"
	got := string(replaceSection([]byte(text), "a", "new\n"))
	if want := "# R\n\n<!-- results:a -->\nnew\n<!-- /results:a -->\n\ntail\n"; got != want {
		t.Errorf("replace: got %q, want %q", got, want)
	}
	got = string(replaceSection([]byte("# R\n"), "b", "body\n"))
	if want := "# R\n\n<!-- results:b -->\nbody\n<!-- /results:b -->\n"; got != want {
		t.Errorf("append: got %q, want %q", got, want)
	}
}

// TestLeaderboard: the summary of a literal two-cell board.
func TestLeaderboard(t *testing.T) {
	board := `{"cells": [
	  {"policies": [
	    {"policy": "kv-aware", "completed": 10, "ttft_ms": {"mean": 10}, "e2e_ms": {"mean": 100}, "slo_met": 0.99},
	    {"policy": "round-robin", "completed": 10, "ttft_ms": {"mean": 20}, "e2e_ms": {"mean": 100}, "slo_met": 0.9}]},
	  {"policies": [
	    {"policy": "kv-aware", "completed": 10, "ttft_ms": {"mean": 12}, "e2e_ms": {"mean": 100}, "slo_met": 0.9},
	    {"policy": "round-robin", "completed": 10, "ttft_ms": {"mean": 10}, "e2e_ms": {"mean": 100}, "slo_met": 0.95}]}],
	 "summary": {"default": "kv-aware", "tolerance": 0.03,
	  "cells": [
	    {"workload": "a", "load": 0.5, "metrics": {"ttft_p99": {"winner": "kv-aware", "ratios": {"kv-aware": 1}}, "ttft_mean": {"winner": "kv-aware", "ratios": {"kv-aware": 1}}}, "default_within_tolerance": {"ttft_p99": true, "ttft_mean": true, "e2e_p99": true, "hit_rate": true}},
	    {"workload": "b", "load": 0.5, "metrics": {"ttft_mean": {"winner": "round-robin", "ratios": {"kv-aware": 1.2, "round-robin": 1}}}, "default_within_tolerance": {"ttft_p99": true, "ttft_mean": false, "e2e_p99": true, "hit_rate": true}}],
	  "wins": {"ttft_mean": {"kv-aware": 1, "round-robin": 1}}}}`
	got, err := leaderboard([][]byte{[]byte(board)})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| ttft mean | 1 of 2 | kv-aware 1, round-robin 1 |",
		"| ttft p99 | 2 of 2 |  |",
		"within 3% of the best on all four metrics in 1 of 2 cells",
		"the best policy in 1 of 2 cells and within 3% of the best in 2.",
		"minus 0.5 point in 1 of 2 cells",
		"| a @ 0.5 | 99.0% | 90.0% (round-robin) | 1.00× | 1.00× | - | - |",
		"| b @ 0.5 | 90.0% | 95.0% (round-robin) | - | 1.20× (round-robin) | - | - |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
}

// TestCapacity: the table of a literal capacity search, one workload.
func TestCapacity(t *testing.T) {
	c := `{"params": [{"name": "workload", "value": "shared-prefix"}], "knee_rate": 10,
	  "policies": [
	    {"policy": "round-robin", "at": [{"level": 0.99, "load": 0.5, "rate": 5}, {"level": 0.9, "load": 0.6, "rate": 6}], "binding": "ttft"},
	    {"policy": "kv-aware", "at": [{"level": 0.99, "load": 1.5, "rate": 15, "capped": true}, {"level": 0.9, "load": 1.5, "rate": 15, "capped": true}]}]}`
	got, err := capacity([][]byte{[]byte(c)})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| shared-prefix | 1.5 | 0.5 (round-robin) | 3.00 | 3.00 | 1.5 | 0.6 (round-robin) | 2.50 |",
		"| shared-prefix | kv-aware ≥ 1.5 (≥ 1.5), round-robin 0.5 (0.6); kv-aware: - |",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	if _, err := capacity([][]byte{[]byte("[" + c + "]")}); err != nil {
		t.Errorf("an array of searches: %v", err)
	}
}

// TestPDCapacity: the best split of each policy at each level in a
// literal search of one workload, and the count of comparisons won.
func TestPDCapacity(t *testing.T) {
	at := func(l99, l90 float64) string {
		return fmt.Sprintf(`[{"level": 0.99, "load": %g}, {"level": 0.9, "load": %g}]`, l99, l90)
	}
	c := `[{"params": [{"name": "workload", "value": "unique"}], "policies": [
	    {"policy": "kv-aware", "at": ` + at(0.7, 0.9) + `},
	    {"policy": "kv-aware 2p+14d", "at": ` + at(0.8, 1.1) + `},
	    {"policy": "dynamo-pd 2p+14d", "at": ` + at(0.6, 1.2) + `},
	    {"policy": "kv-aware 4p+12d", "at": ` + at(0.85, 1) + `},
	    {"policy": "dynamo-pd 4p+12d", "at": ` + at(0.9, 1) + `},
	    {"policy": "pd-round-robin 4p+12d", "at": ` + at(0.5, 0.6) + `}]}]`
	got, err := pdCapacity([][]byte{[]byte(c)})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| unique | 0.7 (0.9) | 0.85 @ 4p (1.1 @ 2p) | 0.5 @ 4p (0.6 @ 4p) | - (-) | 0.9 @ 4p (1.2 @ 2p) |",
		"in 1 of 2 comparisons at 99% attainment, and in 1 of 2 at 90%",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
}

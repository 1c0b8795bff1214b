package main

import (
	"flag"
	"fmt"
	"slices"
	"strings"

	"github.com/kvrouter/kvrouter/proxy"
)

// envPrefix starts every environment variable kvrouter reads.
const envPrefix = "KVROUTER_"

// knownEnv lists the KVROUTER_* variables kvrouter reads: one per serve
// flag (envName), and KVROUTER_QWEN3_DIR, which the tests read.
func knownEnv() []string {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg := proxy.DefaultConfig()
	var path string
	serveFlags(fs, &cfg, &path)
	known := []string{envPrefix + "QWEN3_DIR"}
	fs.VisitAll(func(f *flag.Flag) { known = append(known, envName(f.Name)) })
	slices.Sort(known)
	return known
}

// envWarnings returns one warning per variable of environ ("NAME=value"
// entries, as os.Environ gives) that starts with KVROUTER_ but is not
// known, with the nearest known name when one is close: a misspelt
// setting would otherwise be ignored without a word.
func envWarnings(environ, known []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix) || slices.Contains(known, name) {
			continue
		}
		w := fmt.Sprintf("unknown environment variable %s is ignored", name)
		suffixes := make([]string, len(known))
		for i, k := range known {
			suffixes[i] = strings.TrimPrefix(k, envPrefix)
		}
		if s := closest(strings.TrimPrefix(name, envPrefix), suffixes); s != "" {
			w += fmt.Sprintf(" (did you mean %s%s?)", envPrefix, s)
		} else {
			w += " (each serve flag --name is KVROUTER_NAME, dashes as underscores: see kvrouter serve -h)"
		}
		out = append(out, w)
	}
	slices.Sort(out)
	return out
}

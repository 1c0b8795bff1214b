package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"

	"github.com/kvrouter/kvrouter/internal/sweep"
	"github.com/kvrouter/kvrouter/proxy"
)

// envPrefix starts every environment variable kvrouter reads.
const envPrefix = "KVROUTER_"

// knownEnv lists the KVROUTER_* variables kvrouter reads: one per serve
// and epp flag (envName), and KVROUTER_QWEN3_DIR and KVROUTER_FULL_SWEEP,
// which the tests read.
func knownEnv() []string {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg := proxy.DefaultConfig()
	var path string
	serveFlags(fs, &cfg, &path)
	new(eppFlags).bind(fs)
	known := []string{envPrefix + "QWEN3_DIR", sweep.Env}
	fs.VisitAll(func(f *flag.Flag) { known = append(known, envName(f.Name)) })
	slices.Sort(known)
	return known
}

// unknownVar is a KVROUTER_* variable kvrouter does not read.
type unknownVar struct {
	name string
	// suggestion is the nearest known name, empty when none is close.
	suggestion string
}

// String is the warning's text.
func (u unknownVar) String() string {
	w := fmt.Sprintf("unknown environment variable %s is ignored", u.name)
	if u.suggestion != "" {
		return w + fmt.Sprintf(" (did you mean %s?)", u.suggestion)
	}
	return w + " (each serve or epp flag --name is KVROUTER_NAME, dashes as underscores: see kvrouter serve -h, kvrouter epp -h)"
}

// unknownEnv returns the variables of environ ("NAME=value" entries, as
// os.Environ gives) that start with KVROUTER_ but are not known, sorted,
// each with the nearest known name when one is close: a misspelt setting
// would otherwise be ignored without a word.
func unknownEnv(environ, known []string) []unknownVar {
	suffixes := make([]string, len(known))
	for i, k := range known {
		suffixes[i] = strings.TrimPrefix(k, envPrefix)
	}
	var out []unknownVar
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix) || slices.Contains(known, name) {
			continue
		}
		u := unknownVar{name: name}
		if s := closest(strings.TrimPrefix(name, envPrefix), suffixes); s != "" {
			u.suggestion = envPrefix + s
		}
		out = append(out, u)
	}
	slices.SortFunc(out, func(a, b unknownVar) int { return strings.Compare(a.name, b.name) })
	return out
}

// envWarnings is unknownEnv's warnings as text.
func envWarnings(environ, known []string) []string {
	var out []string
	for _, u := range unknownEnv(environ, known) {
		out = append(out, u.String())
	}
	return out
}

// logUnknownEnv logs a warning per unknown KVROUTER_* variable of this
// process: serve's way, in its log's format, where main prints them for
// the other commands.
func logUnknownEnv(log *slog.Logger) {
	for _, u := range unknownEnv(os.Environ(), knownEnv()) {
		attrs := []any{"name", u.name}
		if u.suggestion != "" {
			attrs = append(attrs, "did_you_mean", u.suggestion)
		}
		log.Warn("unknown environment variable is ignored", attrs...)
	}
}
